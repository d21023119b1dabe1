//! The command line: the subcommands, each with the flags its owner defines (`serve::flags`,
//! `commands::*`). Every flag can also come from a `MESH_PROVISIONER_*` environment variable.

use clap::{Parser, Subcommand};

use crate::commands::accounts::Accounts;
use crate::commands::bootstrap::Bootstrap;
use crate::commands::inspect::{Check, Keygen, RegistryCmd, Sign};
use crate::commands::query::Query;
use crate::commands::verify::Verify;
use crate::serve::flags::Serve;

#[derive(Parser, Debug)]
#[command(name = "mesh-provisioner", version, about = "The provisioning server of the mesh")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process: the size of its biggest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Holds the seat: mirrors the buckets, reconciles the registry and serves the verbs.
    Serve(Serve),
    /// Asks the provisioning verb and prints the answer.
    Query(Query),
    /// Compares the running server's answers with the buckets read straight from the bus;
    /// prints each difference and exits 4 on any.
    Verify(Verify),
    /// Prints the registry compiled into a component (runs the component; no bus needed).
    Registry(RegistryCmd),
    /// Runs the checks a component must pass before it may serve.
    Check(Check),
    /// Makes a signing key for components: the secret into a file (0600), the public key
    /// (for `serve --trust-key`) printed.
    Keygen(Keygen),
    /// Signs a component: writes `<component>.sig`, which `serve --trust-key` requires.
    Sign(Sign),
    /// Makes every bucket of the mesh with the safe settings and limits (run with the
    /// operator's credentials, before anything is installed), and makes safe the ones made
    /// before; refuses (exit 1) a stream of a bucket's name that is not a bucket.
    Bootstrap(Bootstrap),
    /// Renders the mesh's accounts from its nodes and providers: a static server config, or
    /// (`--operator`) JWTs signed with nkeys and a creds file per user; `--push` sends them to
    /// a running server's resolver.
    Accounts(Accounts),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
