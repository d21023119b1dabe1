//! A bare NATS echo responder in a process of its own, for benchmarks: the baseline with the
//! same topology as the verb (requester → nats-server → another process → back).
//!
//! `echo <url> <user> <password> <subject> [<reply file>]`: each request is answered with its
//! own payload, or with the bytes of `<reply file>` (read once: the reply-sized echo); prints
//! `ready` once subscribed.

use futures::StreamExt;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (url, user, password, subject, reply) = match args.as_slice() {
        [_, url, user, password, subject] => (url, user, password, subject, None),
        [_, url, user, password, subject, file] => (url, user, password, subject, Some(bytes::Bytes::from(std::fs::read(file)?))),
        _ => return Err("usage: echo <url> <user> <password> <subject> [<reply file>]".into()),
    };
    let client = async_nats::ConnectOptions::with_user_and_password(user.clone(), password.clone()).connect(url.as_str()).await?;
    let mut sub = client.subscribe(subject.clone()).await?;
    client.flush().await?;
    println!("ready");
    while let Some(m) = sub.next().await {
        if let Some(to) = m.reply {
            client.publish(to, reply.clone().unwrap_or(m.payload)).await?;
        }
    }
    Ok(())
}
