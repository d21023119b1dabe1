//! A real browser for the tests: headless Chromium (Debian's `chromium`, which scripts/setup
//! installs) driven over the DevTools protocol — open a page, evaluate script in it, click at a
//! point as a mouse would, take a screenshot. Also a plain HTTP/1.1 GET for probes.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::Message;

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

/// One GET over HTTP/1.1: the status, the content type and the body.
pub async fn get(url: &str) -> (u16, String, String) {
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    let (host, path) = rest.split_once('/').map(|(h, p)| (h, format!("/{p}"))).unwrap_or((rest, "/".into()));
    let mut s = TcpStream::connect(host).await.unwrap_or_else(|e| panic!("connect {host}: {e}"));
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("read");
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let ctype = head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type:").map(|v| v.trim().to_string())).unwrap_or_default();
    (status, ctype, body.to_string())
}

/// A headless Chromium with one page open, killed when dropped.
pub struct Browser {
    _child: Child,
    _profile: tempfile::TempDir,
    socket: Socket,
    session: String,
    next: u64,
}

impl Browser {
    /// Starts Chromium and opens `url` in a page of `width`×`height`.
    pub async fn open(url: &str, width: u32, height: u32) -> Browser {
        let profile = tempfile::tempdir().expect("profile dir");
        let mut child = Command::new("chromium")
            .args(["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions", "--remote-debugging-port=0"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(format!("--window-size={width},{height}"))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("chromium runs (scripts/setup installs Debian's chromium)");
        // Chromium says where its DevTools endpoint listens on stderr.
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let endpoint = tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(at) = line.find("ws://") {
                    return line[at..].trim().to_string();
                }
            }
            panic!("chromium exited without a DevTools endpoint")
        })
        .await
        .expect("chromium's DevTools endpoint within 30 s");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let (socket, _) = tokio_tungstenite::connect_async(endpoint.as_str()).await.expect("DevTools websocket");
        let mut b = Browser { _child: child, _profile: profile, socket, session: String::new(), next: 0 };
        let target = b.call_browser("Target.createTarget", json!({ "url": url })).await;
        let target = target["targetId"].as_str().expect("a target id").to_string();
        let attached = b.call_browser("Target.attachToTarget", json!({"targetId": target, "flatten": true})).await;
        b.session = attached["sessionId"].as_str().expect("a session id").to_string();
        b.call("Emulation.setDeviceMetricsOverride", json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false})).await;
        b
    }

    async fn send(&mut self, method: &str, params: Value, session: Option<String>) -> Value {
        self.next += 1;
        let id = self.next;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        self.socket.send(Message::Text(msg.to_string().into())).await.expect("send to DevTools");
        loop {
            let m = tokio::time::timeout(Duration::from_secs(30), self.socket.next()).await.expect("DevTools answers within 30 s");
            let Some(Ok(Message::Text(text))) = m else { continue };
            let v: Value = serde_json::from_str(&text).expect("DevTools speaks JSON");
            if v["id"] == json!(id) {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    async fn call_browser(&mut self, method: &str, params: Value) -> Value {
        self.send(method, params, None).await
    }

    /// A DevTools command to the page.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let session = self.session.clone();
        self.send(method, params, Some(session)).await
    }

    /// Evaluates `expression` in the page; its value, as JSON.
    pub async fn eval(&mut self, expression: &str) -> Value {
        let r = self.call("Runtime.evaluate", json!({"expression": expression, "returnByValue": true, "awaitPromise": true})).await;
        assert!(r.get("exceptionDetails").is_none(), "{expression}: {r}");
        r["result"]["value"].clone()
    }

    /// Waits (at most `within`) until `expression` is true in the page.
    pub async fn until(&mut self, expression: &str, within: Duration) {
        let start = Instant::now();
        while self.eval(expression).await != json!(true) {
            assert!(start.elapsed() < within, "the page never made {expression} true");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Clicks the middle of the first element matching `selector`, as a mouse does.
    pub async fn click(&mut self, selector: &str) {
        let q = serde_json::to_string(selector).expect("a selector");
        let at = self.eval(&format!("(() => {{ const e = document.querySelector({q}); if (!e) return null; e.scrollIntoView(); const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()")).await;
        let (x, y) = (at[0].as_f64().unwrap_or_else(|| panic!("nothing matches {selector}")), at[1].as_f64().unwrap_or(0.0));
        for kind in ["mouseMoved", "mousePressed", "mouseReleased"] {
            self.call("Input.dispatchMouseEvent", json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})).await;
        }
    }

    /// Saves a PNG of the page as it looks now.
    pub async fn screenshot(&mut self, to: &Path) {
        let r = self.call("Page.captureScreenshot", json!({"format": "png", "captureBeyondViewport": true})).await;
        let png = base64::engine::general_purpose::STANDARD.decode(r["data"].as_str().expect("image data")).expect("base64");
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir).expect("screenshot dir");
        }
        std::fs::write(to, png).expect("write the screenshot");
    }
}
