//! Logging with `tracing`: human-readable by default (one visible line a record: whatever a
//! node wrote is shown escaped), JSON lines on request; `RUST_LOG` filters.

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,wasmtime=warn,cranelift=warn,async_nats=warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = if json {
        builder.with_writer(std::io::stderr).with_ansi(false).json().try_init()
    } else {
        // No colours: the writer escapes every control character, ESC included, so that a
        // key or reason a node wrote cannot drive the terminal or forge a line.
        builder.with_writer(|| Visible(std::io::stderr())).with_ansi(false).try_init()
    };
}

/// The human log's writer: each record written as one visible line
/// ([`visible_line`](crate::base::visible::visible_line)). The formatter writes a record whole.
struct Visible<W>(W);

impl<W: std::io::Write> std::io::Write for Visible<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write_all(&crate::base::visible::visible_line(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}
