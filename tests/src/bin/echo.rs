//! A bare NATS echo responder in a process of its own, for benchmarks: the baseline with the
//! same topology as the verb (requester → nats-server → another process → back).
//!
//! `echo <url> <user> <password> <subject>`; prints `ready` once subscribed.

use futures::StreamExt;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, user, password, subject] = args.as_slice() else {
        return Err("usage: echo <url> <user> <password> <subject>".into());
    };
    let client = async_nats::ConnectOptions::with_user_and_password(user.clone(), password.clone()).connect(url.as_str()).await?;
    let mut sub = client.subscribe(subject.clone()).await?;
    client.flush().await?;
    println!("ready");
    while let Some(m) = sub.next().await {
        if let Some(reply) = m.reply {
            client.publish(reply, m.payload).await?;
        }
    }
    Ok(())
}
