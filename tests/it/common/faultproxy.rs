//! A userspace TCP proxy between Sluice and Redis that injects network faults on command:
//! added latency, a black hole (bytes held, nothing delivered, no RST: what a partition does
//! to TCP, whose retransmissions deliver them once it heals), resets, one direction cut.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does to the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Passes every byte at once.
    None,
    /// Holds every chunk this long before passing it on (both directions).
    Delay(Duration),
    /// Holds every byte until the fault changes (connections stay open, no RST; new
    /// connections are accepted and wait).
    BlackHole,
    /// Resets every connection (RST), and every new one.
    Reset,
    /// Holds what Sluice sends; Redis's answers still pass.
    CutToRedis,
    /// Holds what Redis answers; Sluice's commands still pass.
    CutFromRedis,
}

/// The proxy: listening on `addr`, forwarding to Redis; stops when dropped.
pub struct FaultProxy {
    /// `127.0.0.1:PORT` to give Sluice instead of Redis's address.
    pub addr: SocketAddr,
    fault: watch::Sender<Fault>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// A proxy to `upstream`, passing everything until told otherwise.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (fault, watching) = watch::channel(Fault::None);
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(connection(client, upstream, watching.clone()));
            }
        });
        Self { addr, fault, task }
    }

    /// Applies `fault` from now on, to every connection.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits until `fault` lets bytes of this direction (`to_redis`) pass; `None` when the
/// connection is to be reset.
async fn open(fault: &mut watch::Receiver<Fault>, to_redis: bool) -> Option<Duration> {
    loop {
        let now = *fault.borrow_and_update();
        match now {
            Fault::None => return Some(Duration::ZERO),
            Fault::Delay(d) => return Some(d),
            Fault::Reset => return None,
            Fault::BlackHole => {}
            Fault::CutToRedis if !to_redis => return Some(Duration::ZERO),
            Fault::CutFromRedis if to_redis => return Some(Duration::ZERO),
            Fault::CutToRedis | Fault::CutFromRedis => {}
        }
        if fault.changed().await.is_err() {
            return None;
        }
    }
}

/// SO_LINGER 0: a close sends RST at once. (tokio deprecates `set_linger` because a positive
/// linger blocks the thread on drop; zero never waits.)
#[allow(deprecated)]
fn reset_on_close(stream: &TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
}

async fn connection(client: TcpStream, upstream: SocketAddr, mut fault: watch::Receiver<Fault>) {
    // Every close is a reset (SO_LINGER 0): a reset fault just drops the connection.
    reset_on_close(&client);
    // A new connection waits out a black hole before it reaches Redis.
    if open(&mut fault, true).await.is_none() {
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    reset_on_close(&server);
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let mut up = tokio::spawn(pump(client_read, server_write, fault.clone(), true));
    let mut down = tokio::spawn(pump(server_read, client_write, fault.clone(), false));
    // Whichever direction ends (or is reset) ends both: its halves are dropped, and with them
    // the sockets.
    tokio::select! {
        _ = &mut up => down.abort(),
        _ = &mut down => up.abort(),
    }
}

/// Copies `from` to `to` under the fault, until either side closes or a reset.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut fault: watch::Receiver<Fault>,
    to_redis: bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            // A reset applies at once, even to an idle connection.
            _ = wait_for_reset(&mut fault) => return,
        };
        match open(&mut fault, to_redis).await {
            None => return,
            Some(delay) if !delay.is_zero() => tokio::time::sleep(delay).await,
            Some(_) => {}
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

async fn wait_for_reset(fault: &mut watch::Receiver<Fault>) {
    loop {
        if *fault.borrow_and_update() == Fault::Reset {
            return;
        }
        if fault.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
