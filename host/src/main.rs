//! The `mesh-provisioner` binary: parses the command line and hands over to the library.

use clap::Parser;
use mesh_provisioner::cli::{Cli, Command, LogFormat, Outcome};

// One thread: a request is ~30 µs of work, and cross-thread wake-ups cost more than that on a
// small machine (measured: verb p50 1.8× → 1.4× a bare echo, throughput 0.28× → 0.39×). A long
// guest call yields every epoch tick, so it cannot starve the seat's renewals.
#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let json = matches!(&cli.command, Command::Serve(s) if s.log_format == LogFormat::Json);
    mesh_provisioner::logging::init(json);
    let done = |r: mesh_provisioner::error::Result<()>| r.map(|()| Outcome::Done);
    let result = match cli.command {
        Command::Serve(args) => done(mesh_provisioner::serve::run(args).await),
        // A rotation script waits on `query holders`' exit 3: `until … query holders …; do sleep 5; done`.
        Command::Query(args) => mesh_provisioner::query::run(args).await,
        // `verify` exits 4 when the server's answers differ from the bus.
        Command::Verify(args) => mesh_provisioner::verify::run(args).await,
        Command::Registry(args) => done(mesh_provisioner::check::registry(&args.component).await),
        Command::Check(args) => done(mesh_provisioner::check::check(&args.component).await),
        Command::Keygen(args) => done(mesh_provisioner::trust::keygen(&args.secret).map(|public| println!("{public}"))),
        Command::Bootstrap(args) => done(mesh_provisioner::bootstrap::run(args).await),
        Command::Sign(args) => done(mesh_provisioner::check::sign(&args.key, &args.component).await),
    };
    match result {
        Ok(outcome) => std::process::ExitCode::from(outcome.exit_code()),
        Err(e) => {
            eprintln!("mesh-provisioner: {}", mesh_provisioner::visible::visible(&e.to_string()));
            std::process::ExitCode::from(match e.kind() {
                mesh_provisioner::error::ErrorKind::Invalid => 2,
                _ => 1,
            })
        }
    }
}
