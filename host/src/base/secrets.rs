//! How a secret looks when printed: never at all. A URL is shown with its password or token
//! replaced by `***`, wherever it is logged, printed or put in an error (below `cli` and
//! `connect`, which both print URLs).

/// `url` (one or a comma-separated list) with any password or token in it replaced by `***`:
/// how a URL is ever printed or logged.
pub fn redact_url(url: &str) -> String {
    url.split(',')
        .map(|one| {
            let Some((scheme, rest)) = one.split_once("://") else { return one.to_string() };
            // A NATS URL has no path: everything before the last `@` is the user's part, so a
            // password holding `/` or `@` is hidden whole.
            match rest.rsplit_once('@') {
                Some((userinfo, host)) => match userinfo.split_once(':') {
                    Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
                    None => format!("{scheme}://***@{host}"),
                },
                None => one.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_printed_without_its_secret() {
        assert_eq!(redact_url("nats://u:hunter2@127.0.0.1:4222"), "nats://u:***@127.0.0.1:4222");
        assert_eq!(redact_url("tls://tok-secret@a:1,nats://b:2"), "tls://***@a:1,nats://b:2");
        assert_eq!(redact_url("nats://u:pa/ss@w@h:1"), "nats://u:***@h:1");
        assert_eq!(redact_url("127.0.0.1:4222"), "127.0.0.1:4222");
    }
}
