//! `bootstrap`: the operator makes every bucket of the mesh before anything is installed
//! (`nats::mesh` says which and how), and reads a line per bucket: made, safe, made safe, or
//! refused with why.

use async_nats::jetstream;

use std::path::PathBuf;

use clap::Args;

use crate::nats::connect::Connect;
use crate::nats::mesh::BucketFlags;

use crate::base::error::{Error, ErrorKind, Result};
use crate::nats::mesh::{apply, BucketOutcome, Plan};

/// `mesh-provisioner bootstrap`: prints a line per bucket; an error when any was refused.
pub async fn run(args: Bootstrap) -> Result<()> {
    let runtime = crate::runtime::Runtime::new()?;
    let loaded = crate::runtime::component::load(&runtime, &args.component, None, None, crate::runtime::Limits::default()).await?;
    let plan = Plan::of(&loaded.guest, &args.nodes, &args.providers, args.buckets, crate::runtime::Limits::default()).await?;
    for node in &args.retired {
        if args.nodes.contains(node) {
            return Err(Error::new(ErrorKind::Config, format!("--retire-node {node:?} is also given as --node")));
        }
        crate::accounts::Mesh::new(vec![node.clone()], vec![])?;
    }
    let client = match &args.connect.nats_url {
        Some(_) => crate::nats::connect::connect_cli(&args.connect, "mesh-provisioner bootstrap").await?,
        None => crate::nats::connect::connect_embedded(&args.connect, crate::nats::connect::OPERATOR_USER, "mesh-provisioner bootstrap").await?,
    };
    let js = jetstream::new(client.clone());
    let mut report = apply(&js, &plan).await;
    for node in &args.retired {
        report.buckets.extend(crate::nats::mesh::retire(&js, node).await.buckets);
    }
    let _ = client.drain().await;
    for (bucket, outcome) in &report.buckets {
        match outcome {
            BucketOutcome::Made => println!("{bucket:<32} made"),
            BucketOutcome::Safe => println!("{bucket:<32} safe"),
            BucketOutcome::Fixed(what) => println!("{bucket:<32} made safe: {}", what.join(", ")),
            BucketOutcome::Refused(why) => println!("{bucket:<32} REFUSED: {}", crate::base::visible::visible(why)),
            BucketOutcome::Failed(why) => println!("{bucket:<32} FAILED: {}", crate::base::visible::visible(why)),
        }
    }
    report.result()
}

#[derive(Args, Debug)]
pub struct Bootstrap {
    /// The component whose buckets are made: the ones its plans and notices read (a `*` in a
    /// name filled with each --node for the per-node buckets, each --provider for the others),
    /// besides the provisioner's own.
    #[arg(long, env = "MESH_PROVISIONER_COMPONENT")]
    pub component: PathBuf,
    /// A node of the mesh (its compositions' bucket is made); repeat for each.
    #[arg(long = "node")]
    pub nodes: Vec<String>,
    /// A provider module of the mesh (its `<provider>_bound` bucket is made); repeat for each.
    #[arg(long = "provider")]
    pub providers: Vec<String>,
    /// A node that left the mesh: the buckets every node writes stop sourcing its share (its
    /// keys stay, and its modules' status names them orphaned); repeat for each.
    #[arg(long = "retire-node")]
    pub retired: Vec<String>,
    #[command(flatten)]
    pub buckets: BucketFlags,
    #[command(flatten)]
    pub connect: Connect,
}
