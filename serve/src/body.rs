//! Reading a request body under a size limit and a deadline, without ever holding more than the
//! limit: a declared Content-Length over the limit is refused before a byte of the body is read,
//! and a streamed (chunked, or HTTP/2) body is counted frame by frame and cut as soon as it passes
//! the limit.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Response, StatusCode, Version};
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use std::time::Duration;
use thiserror::Error;

/// Why a body was not read.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum BodyError {
    /// More than `limit` bytes, declared or received.
    #[error("request body is larger than {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// The body did not arrive whole in time.
    #[error("request body not received within {after:?}")]
    Timeout {
        /// The body timeout.
        after: Duration,
    },
    /// The connection failed or the framing was invalid while reading.
    #[error("reading the request body: {0}")]
    Read(String),
}

/// The Content-Length a request declares, if it declares a valid one.
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Reads `body` whole if it is at most `limit` bytes and arrives within `timeout`.
///
/// A `declared` length over the limit fails before the body is polled at all; otherwise frames are
/// counted as they come and reading stops at the first frame that passes the limit, so at most
/// `limit` bytes plus one frame are ever held.
pub async fn read_limited<B>(
    body: B,
    declared: Option<u64>,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, BodyError>
where
    B: hyper::body::Body + Unpin,
    B::Error: std::fmt::Display,
{
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge { limit });
    }
    let deadline = tokio::time::Instant::now() + timeout;
    let mut body = body;
    let mut buf = BytesMut::with_capacity(declared.map_or(0, |n| n as usize));
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(BodyError::Timeout { after: timeout }),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(BodyError::Read(e.to_string())),
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(mut data) = frame.into_data() {
            use bytes::Buf;
            if buf.len() + data.remaining() > limit {
                return Err(BodyError::TooLarge { limit });
            }
            while data.has_remaining() {
                let chunk = data.chunk();
                let n = chunk.len();
                buf.extend_from_slice(chunk);
                data.advance(n);
            }
        }
    }
    Ok(buf.freeze())
}

/// The answer to a body that was not read: 413, 408 or 400 with a metav1.Status body, as the API
/// server answers its own clients. On HTTP/1 the connection is closed after it: the rest of the
/// body is still on the wire and will not be read.
pub fn refusal(e: &BodyError, version: Version) -> Response<Body> {
    let (code, reason) = match e {
        BodyError::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge"),
        BodyError::Timeout { .. } => (StatusCode::REQUEST_TIMEOUT, "Timeout"),
        BodyError::Read(_) => (StatusCode::BAD_REQUEST, "BadRequest"),
    };
    let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": e.to_string(), "reason": reason, "code": code.as_u16()});
    let mut resp = Response::new(Body::from(status.to_string()));
    *resp.status_mut() = code;
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if version <= Version::HTTP_11 {
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use futures::stream::StreamExt;
    use http_body_util::StreamBody;
    use hyper::body::Frame;
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// An endless body of `chunk`-byte frames that counts how many bytes were pulled from it.
    fn endless(
        chunk: usize,
        pulled: Arc<AtomicUsize>,
    ) -> impl hyper::body::Body<Data = Bytes, Error = Infallible> + Unpin {
        let frames = futures::stream::repeat_with(move || {
            pulled.fetch_add(chunk, Ordering::SeqCst);
            Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b'x'; chunk])))
        });
        StreamBody::new(frames.boxed())
    }

    #[tokio::test]
    async fn a_declared_length_over_the_limit_is_refused_unread() {
        let pulled = Arc::new(AtomicUsize::new(0));
        let r = read_limited(
            endless(1024, pulled.clone()),
            Some(1 << 30),
            3 << 20,
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(r, Err(BodyError::TooLarge { limit: 3 << 20 }));
        assert_eq!(pulled.load(Ordering::SeqCst), 0, "the body was polled");
    }

    #[tokio::test]
    async fn a_streamed_body_is_cut_one_frame_past_the_limit() {
        let pulled = Arc::new(AtomicUsize::new(0));
        let limit = 3 << 20;
        let r = read_limited(
            endless(16 * 1024, pulled.clone()),
            None,
            limit,
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(r, Err(BodyError::TooLarge { limit }));
        let n = pulled.load(Ordering::SeqCst);
        assert!(n > limit && n <= limit + 16 * 1024, "pulled {n} bytes");
    }

    #[tokio::test]
    async fn bodies_within_the_limit_are_read_whole() {
        let frames = futures::stream::iter(
            ["{\"a\":", "1}"].map(|s| Ok::<_, Infallible>(Frame::data(Bytes::from(s)))),
        );
        let got = read_limited(StreamBody::new(frames), None, 7, Duration::from_secs(5)).await;
        assert_eq!(got, Ok(Bytes::from_static(b"{\"a\":1}")));
        let exact = read_limited(
            http_body_util::Full::new(Bytes::from_static(b"12345678")),
            Some(8),
            8,
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(exact.unwrap().len(), 8);
    }

    #[tokio::test]
    async fn a_body_that_never_ends_times_out() {
        let stalled =
            StreamBody::new(futures::stream::pending::<Result<Frame<Bytes>, Infallible>>());
        let after = Duration::from_millis(50);
        let r = read_limited(stalled, None, 10, after).await;
        assert_eq!(r, Err(BodyError::Timeout { after }));
    }

    #[test]
    fn refusals_are_statuses_that_close_http1() {
        let r = refusal(&BodyError::TooLarge { limit: 1 }, Version::HTTP_11);
        assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(r.headers()[header::CONNECTION], "close");
        let r = refusal(
            &BodyError::Timeout {
                after: Duration::from_secs(1),
            },
            Version::HTTP_2,
        );
        assert_eq!(r.status(), StatusCode::REQUEST_TIMEOUT);
        assert!(r.headers().get(header::CONNECTION).is_none());
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("42"));
        assert_eq!(declared_length(&h), Some(42));
    }
}
