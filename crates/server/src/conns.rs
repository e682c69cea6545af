//! A cap on the Flight connections open at once.
//!
//! Each accepted connection holds a permit until it closes; one accepted
//! while every permit is out is closed at once (counted in
//! `memwal_server_connections_refused_total`, logged) and the daemon goes
//! on serving the others. Without a cap each idle TCP connection costs a
//! task and buffers for as long as a client keeps it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// An accepted connection and its permit (released when it closes).
pub struct LimitedConnection {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl Connected for LimitedConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for LimitedConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for LimitedConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The connections `listener` accepts, at most `max` open at once (a
/// connection past it is closed on accept). Accept errors (a file
/// descriptor limit, say) are logged and accepting goes on after a short
/// pause, so one never ends the server.
pub fn limited_incoming(
    listener: TcpListener,
    max: usize,
) -> impl Stream<Item = Result<LimitedConnection, std::io::Error>> + Send + 'static {
    let permits = Arc::new(Semaphore::new(max));
    futures::stream::unfold((listener, permits), move |(listener, permits)| async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a Flight connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                metrics::counter!("memwal_server_connections_refused_total").increment(1);
                tracing::warn!(%peer, max, "connection refused: max_connections are open");
                drop(stream);
                continue;
            };
            let _ = stream.set_nodelay(true);
            let conn = LimitedConnection {
                stream,
                _permit: permit,
            };
            return Some((Ok(conn), (listener, permits)));
        }
    })
}
