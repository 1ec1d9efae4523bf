//! A minimal HTTP/1.1 keep-alive client, the same for the edge and for the baseline so
//! neither pays for a heavier client: it writes a prepared request and reads the response
//! (`Content-Length` or chunked), noting when its first byte arrived.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One keep-alive connection.
pub struct Connection {
    stream: TcpStream,
    buf: Vec<u8>,
    /// Bytes of `buf` already consumed.
    start: usize,
}

/// What one exchange took and gave.
pub struct Exchange {
    /// The status code.
    pub status: u16,
    /// From writing the request to the response's first byte.
    pub first_byte: Duration,
    /// From writing the request to the response's last byte.
    pub total: Duration,
    /// The body, de-chunked.
    pub body: Vec<u8>,
    /// The edge's `x-edge-node` header: the node that answered.
    pub node: Option<String>,
    /// The edge's `x-edge-run-id` header: the run that answered.
    pub run_id: Option<String>,
    /// From writing the request to the end of the first body chunk the watch accepted
    /// (see [`Connection::exchange_watching`]).
    pub watched: Option<Duration>,
}

/// A `POST path` request with a JSON body, ready to write as is.
pub fn post_json(addr: SocketAddr, path: &str, body: &str) -> Vec<u8> {
    post_json_with(addr, path, &[], body)
}

/// [`post_json`] with `headers` (name, value) besides.
pub fn post_json_with(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Vec<u8> {
    let headers: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Accept: */*\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

impl Connection {
    pub async fn connect(addr: SocketAddr) -> anyhow::Result<Self> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("cannot connect to {addr}"))?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buf: Vec::with_capacity(16 * 1024),
            start: 0,
        })
    }

    /// Reads more bytes into the buffer; errors at end of stream.
    async fn fill(&mut self) -> anyhow::Result<()> {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.buf.reserve(16 * 1024);
        }
        let n = self.stream.read_buf(&mut self.buf).await?;
        if n == 0 {
            bail!("the server closed the connection");
        }
        Ok(())
    }

    fn pending(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// Takes `n` pending bytes (which must be there).
    fn take(&mut self, n: usize) -> &[u8] {
        let at = self.start;
        self.start += n;
        &self.buf[at..at + n]
    }

    /// Reads up to and including the next CRLF; returns the line without it.
    async fn line(&mut self) -> anyhow::Result<String> {
        loop {
            if let Some(end) = self.pending().windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&self.take(end + 2)[..end]).into_owned();
                return Ok(line);
            }
            self.fill().await?;
        }
    }

    /// Reads exactly `n` bytes, appending them to `out` when given.
    async fn exact(&mut self, mut n: usize, mut out: Option<&mut Vec<u8>>) -> anyhow::Result<()> {
        while n > 0 {
            if self.pending().is_empty() {
                self.fill().await?;
            }
            let k = n.min(self.pending().len());
            let bytes = self.take(k);
            if let Some(out) = out.as_deref_mut() {
                out.extend_from_slice(bytes);
            }
            n -= k;
        }
        Ok(())
    }

    /// Writes `request` and reads the whole response; keeps the body when `keep_body`.
    pub async fn exchange(&mut self, request: &[u8], keep_body: bool) -> anyhow::Result<Exchange> {
        self.exchange_watching(request, keep_body, None).await
    }

    /// [`Self::exchange`], noting in [`Exchange::watched`] when the body read so far first
    /// satisfies `watch` (looked at after each chunk of a chunked body; the body is kept).
    pub async fn exchange_watching(
        &mut self,
        request: &[u8],
        keep_body: bool,
        watch: Option<fn(&[u8]) -> bool>,
    ) -> anyhow::Result<Exchange> {
        let keep_body = keep_body || watch.is_some();
        let mut watched = None;
        let begun = Instant::now();
        self.stream.write_all(request).await?;
        if self.pending().is_empty() {
            self.fill().await?;
        }
        let first_byte = begun.elapsed();
        let status_line = self.line().await?;
        let status: u16 = status_line
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .with_context(|| format!("bad status line {status_line:?}"))?;
        let mut headers = Vec::new();
        loop {
            let line = self.line().await?;
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
            }
        }
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        let node = header("x-edge-node").map(str::to_owned);
        let run_id = header("x-edge-run-id").map(str::to_owned);
        let mut body = Vec::new();
        let keep = keep_body.then_some(&mut body);
        if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
            let mut keep = keep;
            loop {
                let size_line = self.line().await?;
                let size =
                    usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                        .with_context(|| format!("bad chunk size {size_line:?}"))?;
                if size == 0 {
                    // Trailers, then the empty line.
                    while !self.line().await?.is_empty() {}
                    break;
                }
                self.exact(size, keep.as_deref_mut()).await?;
                if watched.is_none()
                    && let (Some(watch), Some(body)) = (watch, keep.as_deref())
                    && watch(body)
                {
                    watched = Some(begun.elapsed());
                }
                self.exact(2, None).await?;
            }
        } else {
            let length: usize = header("content-length")
                .context("a response with neither Content-Length nor chunked encoding")?
                .parse()
                .context("bad Content-Length")?;
            self.exact(length, keep).await?;
        }
        Ok(Exchange {
            status,
            first_byte,
            total: begun.elapsed(),
            body,
            node,
            run_id,
            watched,
        })
    }
}
