//! The kubelet's plugin watcher calls `Registration.GetInfo` with grpc-go dialling the socket
//! path, and grpc-go then sends the escaped path as the HTTP/2 `:authority`
//! (`%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2F...`). That is not a valid authority, and h2 (under
//! tonic) resets such a stream with PROTOCOL_ERROR (hyperium/h2#487, open; kubernetes#109081: the
//! kubelet set `localhost` for some of its clients, not for this one; seen on the real kubelet 1.36:
//! "failed to get plugin info using RPC GetInfo ... RST_STREAM with error code: PROTOCOL_ERROR").
//!
//! So each connection on our sockets passes through this small relay into the in-process gRPC
//! server, which rewrites the `:authority` of every request's HEADERS frame to `localhost` and
//! copies everything else byte for byte. HPACK (RFC 7541) is walked, not decoded: each field's
//! representation is kept (so both ends' dynamic tables gain an entry at the same position), only
//! the value string of a field named `:authority` (static index 1) is replaced.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};

/// The HTTP/2 client connection preface (RFC 9113 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// `:authority` in the HPACK static table (RFC 7541 appendix A).
const AUTHORITY_INDEX: u64 = 1;
const LOCALHOST: &[u8] = b"localhost";

/// One relayed connection, as the gRPC server sees it.
pub struct Conn(pub DuplexStream);

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Relays one client connection into `server` until either side closes.
pub async fn relay<C>(client: C, server: DuplexStream)
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_r, mut client_w) = tokio::io::split(client);
    let (mut server_r, mut server_w) = tokio::io::split(server);
    let up = async {
        let r = client_to_server(&mut client_r, &mut server_w).await;
        let _ = server_w.shutdown().await;
        r
    };
    let down = async {
        let r = tokio::io::copy(&mut server_r, &mut client_w).await;
        let _ = client_w.shutdown().await;
        r.map(|_| ())
    };
    let _ = tokio::join!(up, down);
}

async fn client_to_server<R, W>(r: &mut R, w: &mut W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    r.read_exact(&mut preface).await?;
    w.write_all(&preface).await?;
    if &preface != PREFACE {
        // Not HTTP/2 with prior knowledge: the server will say so.
        tokio::io::copy(r, w).await?;
        return Ok(());
    }
    loop {
        let mut head = [0u8; 9];
        match r.read_exact(&mut head).await {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            other => other?,
        };
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0u8; len];
        r.read_exact(&mut payload).await?;
        if head[3] == HEADERS && head[4] & END_HEADERS != 0 {
            if let Some((flags, rewritten)) = rewrite_headers(head[4], &payload) {
                let n = u32::try_from(rewritten.len())
                    .unwrap_or(u32::MAX)
                    .to_be_bytes();
                head[..3].copy_from_slice(&n[1..]);
                head[4] = flags;
                payload = rewritten;
            }
        }
        w.write_all(&head).await?;
        w.write_all(&payload).await?;
        w.flush().await?;
    }
}

/// A HEADERS frame's payload with `:authority` set to `localhost` (padding dropped); `None` when
/// the frame has no `:authority` or cannot be walked (it is then passed on as it came).
pub fn rewrite_headers(flags: u8, payload: &[u8]) -> Option<(u8, Vec<u8>)> {
    let mut body = payload;
    if flags & PADDED != 0 {
        let pad = usize::from(*body.first()?);
        body = body.get(1..body.len().checked_sub(pad)?)?;
    }
    let (priority, block) = if flags & PRIORITY != 0 {
        (body.get(..5)?, body.get(5..)?)
    } else {
        (&[][..], body)
    };
    let block = rewrite_authority(block)?;
    let mut out = priority.to_vec();
    out.extend_from_slice(&block);
    Some((flags & !PADDED, out))
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 5.1) at `b[*at]`.
fn integer(b: &[u8], at: &mut usize, n: u32) -> Option<u64> {
    let max = (1u64 << n) - 1;
    let mut v = u64::from(*b.get(*at)?) & max;
    *at += 1;
    if v < max {
        return Some(v);
    }
    let mut shift = 0;
    loop {
        let byte = *b.get(*at)?;
        *at += 1;
        v = v.checked_add(u64::from(byte & 0x7f).checked_shl(shift)?)?;
        shift += 7;
        if byte & 0x80 == 0 || shift > 56 {
            return (byte & 0x80 == 0).then_some(v);
        }
    }
}

/// Skips a string literal (5.2) at `b[*at]`; its raw bytes when not Huffman-coded.
fn string<'a>(b: &'a [u8], at: &mut usize) -> Option<(bool, &'a [u8])> {
    let huffman = *b.get(*at)? & 0x80 != 0;
    let len = usize::try_from(integer(b, at, 7)?).ok()?;
    let s = b.get(*at..at.checked_add(len)?)?;
    *at += len;
    Some((huffman, s))
}

/// The header block with every `:authority` value replaced by `localhost`; `None` when there is
/// none, or the block is not well formed.
pub fn rewrite_authority(b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(b.len());
    let mut at = 0;
    let mut changed = false;
    while at < b.len() {
        let start = at;
        let first = b[at];
        let prefix = if first & 0x80 != 0 {
            integer(b, &mut at, 7)?; // indexed field
            out.extend_from_slice(&b[start..at]);
            continue;
        } else if first & 0x40 != 0 {
            6 // literal with incremental indexing
        } else if first & 0x20 != 0 {
            integer(b, &mut at, 5)?; // dynamic table size update
            out.extend_from_slice(&b[start..at]);
            continue;
        } else {
            4 // literal without indexing / never indexed
        };
        let index = integer(b, &mut at, prefix)?;
        let is_authority = if index == 0 {
            let (huffman, name) = string(b, &mut at)?;
            !huffman && name == b":authority"
        } else {
            index == AUTHORITY_INDEX
        };
        let name_end = at;
        string(b, &mut at)?;
        out.extend_from_slice(&b[start..name_end]);
        if is_authority {
            out.push(LOCALHOST.len() as u8); // not Huffman, length below 127
            out.extend_from_slice(LOCALHOST);
            changed = true;
        } else {
            out.extend_from_slice(&b[name_end..at]);
        }
    }
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn lit(s: &[u8]) -> Vec<u8> {
        let mut v = vec![s.len() as u8];
        v.extend_from_slice(s);
        v
    }

    #[test]
    fn authority_becomes_localhost_and_the_rest_is_kept() {
        let path = b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.vgpu.io-reg.sock";
        // :method POST (static 3), :scheme http (static 6), :path literal with indexing
        // (name static 4), :authority literal with indexing (name static 1), a user header
        // literal without indexing with a literal name, a size update.
        let mut block = vec![0x83, 0x86, 0x44];
        block.extend(lit(b"/pluginregistration.Registration/GetInfo"));
        block.push(0x41);
        block.extend(lit(path));
        block.push(0x00);
        block.extend(lit(b"te"));
        block.extend(lit(b"trailers"));
        block.push(0x3f);
        block.push(0xe1);
        block.push(0x1f);
        let out = rewrite_authority(&block).unwrap();
        let mut want = vec![0x83, 0x86, 0x44];
        want.extend(lit(b"/pluginregistration.Registration/GetInfo"));
        want.push(0x41);
        want.extend(lit(b"localhost"));
        want.push(0x00);
        want.extend(lit(b"te"));
        want.extend(lit(b"trailers"));
        want.extend([0x3f, 0xe1, 0x1f]);
        assert_eq!(out, want);
        // A Huffman-coded value is replaced too (its bytes are skipped by length).
        let mut h = vec![0x01, 0x80 | 3, 0xaa, 0xbb, 0xcc];
        h.push(0x83);
        let out = rewrite_authority(&h).unwrap();
        assert_eq!(out, [&[0x01][..], &lit(b"localhost"), &[0x83]].concat());
        // Nothing to change, or a truncated block: passed on as it came.
        assert_eq!(rewrite_authority(&[0x83, 0x86]), None);
        assert_eq!(rewrite_authority(&[0x41, 10, b'a']), None);
    }

    #[test]
    fn padding_is_dropped_and_priority_kept() {
        let block = [&[0x41][..], &lit(b"/x.sock")].concat();
        let mut payload = vec![2u8]; // pad length
        payload.extend([0, 0, 0, 1, 16]); // priority
        payload.extend(&block);
        payload.extend([0, 0]);
        let (flags, out) = rewrite_headers(PADDED | PRIORITY | END_HEADERS, &payload).unwrap();
        assert_eq!(flags, PRIORITY | END_HEADERS);
        assert_eq!(
            out,
            [&[0, 0, 0, 1, 16][..], &[0x41], &lit(b"localhost")].concat()
        );
    }
}
