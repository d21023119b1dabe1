//! The `mesh-provisioner` binary: parses the command line and hands over to the library.

use clap::Parser;
use mesh_provisioner::cli::{Cli, Command, LogFormat};

// One thread: a request is ~30 µs of work, and cross-thread wake-ups cost more than that on a
// small machine (measured: verb p50 1.8× → 1.4× a bare echo, throughput 0.28× → 0.39×). A long
// guest call yields every epoch tick, so it cannot starve the seat's renewals.
#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let json = matches!(&cli.command, Command::Serve(s) if s.log_format == LogFormat::Json);
    mesh_provisioner::logging::init(json);
    let result = match cli.command {
        Command::Serve(args) => mesh_provisioner::serve::run(args).await,
        Command::Query(args) => mesh_provisioner::query::run(args).await,
        Command::Verify(args) => mesh_provisioner::verify::run(args).await,
        Command::Registry(args) => mesh_provisioner::check::registry(&args.component).await,
        Command::Check(args) => mesh_provisioner::check::check(&args.component).await,
        Command::Keygen(args) => mesh_provisioner::trust::keygen(&args.secret).map(|public| println!("{public}")),
        Command::Bootstrap(args) => mesh_provisioner::bootstrap::run(args).await,
        Command::Sign(args) => mesh_provisioner::check::sign(&args.key, &args.component).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mesh-provisioner: {e}");
            std::process::ExitCode::from(match e.kind() {
                mesh_provisioner::error::ErrorKind::Invalid => 2,
                // A rotation script waits on this one: `until … query holders …; do sleep 5; done`.
                mesh_provisioner::error::ErrorKind::NotCurrent => 3,
                // `verify` found the server's answers differ from the bus.
                mesh_provisioner::error::ErrorKind::Diverged => 4,
                _ => 1,
            })
        }
    }
}
