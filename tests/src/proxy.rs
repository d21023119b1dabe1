//! A TCP relay between two loopback ports that a test can cut and restore: a link between
//! servers (a leaf node and its hub) that drops as a real network does, without stopping
//! either server.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Relay {
    pub port: u16,
    open: Arc<AtomicBool>,
    /// Bumped on each cut: every connection relayed before it ends.
    cuts: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Relays each connection made to a free port to `127.0.0.1:<to>`.
    pub async fn start(to: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let port = listener.local_addr().expect("its address").port();
        let open = Arc::new(AtomicBool::new(true));
        let (cuts, _) = watch::channel(0u64);
        let (open2, cuts2) = (open.clone(), cuts.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !open2.load(Ordering::SeqCst) {
                    // Refused while cut: the connection is closed at once.
                    continue;
                }
                let mut cut = cuts2.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", to)).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Relay { port, open, cuts, task }
    }

    /// Drops every relayed connection and refuses new ones until [`Relay::restore`].
    pub fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        self.cuts.send_modify(|n| *n += 1);
    }

    pub fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
        self.cuts.send_modify(|n| *n += 1);
    }
}
