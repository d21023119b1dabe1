//! `accounts`: the mesh's accounts rendered from its nodes and providers (`accounts::parties`),
//! as a static server config or, with `--operator`, signed for operator mode: the operator
//! JWT, every account's JWT, a creds file per user (`0600`) and the keys that signed them (kept
//! in `--out`, so a later run with more nodes keeps everyone's identity). `--revoke` refuses a
//! user from now on; `--push` sends every account to the running server's resolver, so nodes
//! join and leave with no restart.

use std::path::PathBuf;

use clap::Args;

use crate::accounts::operator;
use crate::accounts::{conf, Mesh};
use crate::base::error::{Error, ErrorKind, Result};

/// `mesh-provisioner accounts`.
#[derive(Args, Debug)]
pub struct Accounts {
    /// The mesh's nodes, comma-separated (`alpha,beta`), or repeated.
    #[arg(long, value_delimiter = ',')]
    pub nodes: Vec<String>,
    /// The mesh's providers, comma-separated, or repeated.
    #[arg(long, value_delimiter = ',')]
    pub providers: Vec<String>,
    /// The mesh from a JSON file, `{"nodes": […], "providers": […]}`, instead of the two flags.
    #[arg(long, conflicts_with_all = ["nodes", "providers"])]
    pub mesh: Option<PathBuf>,
    /// The directory written: `nats-server.conf`; in operator mode also `operator.jwt`,
    /// `resolver/` (every account JWT, a full resolver's layout: seed a server's resolver
    /// directory with it), `creds/<user>.creds` and `keys/` (the signing keys: keep them).
    #[arg(long)]
    pub out: PathBuf,
    /// Operator mode: accounts and users as JWTs signed with nkeys, read by the server from a
    /// full resolver; without it, a static config with one password placeholder a user.
    #[arg(long)]
    pub operator: bool,
    /// A user to refuse from now on (operator mode): its account's JWT revokes it and it is
    /// never issued again. Repeat for each.
    #[arg(long = "revoke", requires = "operator")]
    pub revoke: Vec<String>,
    /// A running server to push every account to (operator mode), as the system user
    /// (`--out`'s `creds/system.creds`).
    #[arg(long, requires = "operator")]
    pub push: Option<String>,
}

/// Reads the mesh from the flags or the file.
fn mesh_of(args: &Accounts) -> Result<Mesh> {
    match &args.mesh {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| Error::new(ErrorKind::Config, format!("reading {}: {e}", path.display())))?;
            let m: Mesh = serde_json::from_str(&text).map_err(|e| Error::new(ErrorKind::Config, format!("{} is not a mesh: {e}", path.display())))?;
            Mesh::new(m.nodes, m.providers)
        }
        None => Mesh::new(args.nodes.clone(), args.providers.clone()),
    }
}

/// `mesh-provisioner accounts`: writes the files and prints what it wrote.
pub async fn run(args: Accounts) -> Result<()> {
    let mesh = mesh_of(&args)?;
    if !args.operator {
        crate::base::files::private_dirs(&args.out).map_err(|e| Error::new(ErrorKind::Config, format!("making {}: {e}", args.out.display())))?;
        let path = args.out.join("nats-server.conf");
        crate::base::files::write_private(&path, conf::render(&mesh).as_bytes())
            .map_err(|e| Error::new(ErrorKind::Config, format!("writing {}: {e}", path.display())))?;
        println!("{} accounts for {} nodes and {} providers: {}", mesh.accounts().len(), mesh.nodes.len(), mesh.providers.len(), path.display());
        return Ok(());
    }
    let signed = operator::render_into(&mesh, &args.out, &args.revoke)?;
    println!(
        "{} accounts ({} retired), {} users' creds for {} nodes and {} providers in {}",
        signed.accounts.len(),
        signed.retired.len(),
        signed.creds.len(),
        mesh.nodes.len(),
        mesh.providers.len(),
        args.out.display()
    );
    if let Some(url) = &args.push {
        let creds = std::fs::read_to_string(args.out.join("creds/system.creds"))
            .map_err(|e| Error::new(ErrorKind::Config, format!("the system user's creds in {}: {e}", args.out.display())))?;
        let options = async_nats::ConnectOptions::with_credentials(&creds)
            .map_err(|e| Error::new(ErrorKind::Config, format!("the system user's creds: {e}")))?
            .name("mesh-provisioner accounts");
        let client = crate::nats::connect::connect(url, options).await?;
        for a in &signed.accounts {
            crate::nats::claims::push(&client, &a.name, &a.jwt).await?;
        }
        let _ = client.flush().await;
        println!("pushed {} accounts to {url}", signed.accounts.len());
    }
    Ok(())
}
