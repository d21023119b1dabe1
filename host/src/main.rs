//! The `mesh-provisioner` binary: parses the command line and hands over to the library.

use clap::Parser;
use mesh_provisioner::base::logging::LogFormat;
use mesh_provisioner::cli::{Cli, Command};
use mesh_provisioner::commands::Exit;

// One thread: a request is tens of microseconds of work, and cross-thread wake-ups cost more
// than that on a small machine (docs/performance.md has the figures). A long guest call yields
// every epoch tick, so it cannot starve the seat's renewals.
#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let json = matches!(&cli.command, Command::Serve(s) if s.log_format == LogFormat::Json);
    mesh_provisioner::base::logging::init(json);
    let done = |r: mesh_provisioner::base::error::Result<()>| r.map(|()| Exit::Done);
    let result = match cli.command {
        Command::Serve(args) => done(mesh_provisioner::serve::run(args).await),
        // A rotation script waits on `query holders`' exit 3: `until … query holders …; do sleep 5; done`.
        Command::Query(args) => mesh_provisioner::commands::query::run(args).await,
        // `verify` exits 4 when the server's answers differ from the bus.
        Command::Verify(args) => mesh_provisioner::commands::verify::run(args).await,
        Command::Registry(args) => done(mesh_provisioner::commands::inspect::registry(&args.component).await),
        Command::Check(args) => done(mesh_provisioner::commands::inspect::check(&args.component).await),
        Command::Keygen(args) => done(mesh_provisioner::runtime::trust::keygen(&args.secret).map(|public| println!("{public}"))),
        Command::Bootstrap(args) => done(mesh_provisioner::commands::bootstrap::run(args).await),
        Command::Accounts(args) => done(mesh_provisioner::commands::accounts::run(args).await),
        Command::Sign(args) => done(mesh_provisioner::commands::inspect::sign(&args.key, &args.component).await),
    };
    match result {
        Ok(outcome) => std::process::ExitCode::from(outcome.exit_code()),
        Err(e) => {
            eprintln!("mesh-provisioner: {}", mesh_provisioner::base::visible::visible(&e.to_string()));
            std::process::ExitCode::from(match e.kind() {
                mesh_provisioner::base::error::ErrorKind::Invalid => 2,
                _ => 1,
            })
        }
    }
}
