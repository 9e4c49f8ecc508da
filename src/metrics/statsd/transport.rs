//! The connection to the statsd server: TCP for statsd (connected on the first flush, again
//! after a failure), UDP for DogStatsD (datagrams of at most [`MAX_DATAGRAM`] bytes).

use std::io;
use std::time::Duration;

use prometheus::IntCounter;
use tokio::io::AsyncWriteExt;

use super::IO_TIMEOUT;
use super::{StatsdFormat, StatsdSettings};

/// Largest DogStatsD datagram: one that is not fragmented on an Ethernet path (the size
/// DogStatsD clients use).
pub const MAX_DATAGRAM: usize = 1432;

/// The connection to the statsd server.
pub(super) enum Transport {
    /// statsd over TCP; connected on the first flush, again after a failure.
    Tcp {
        addr: (String, u16),
        stream: Option<tokio::net::TcpStream>,
    },
    /// DogStatsD over UDP.
    Udp {
        addr: (String, u16),
        socket: Option<tokio::net::UdpSocket>,
    },
}

impl Transport {
    pub(super) fn new(settings: &StatsdSettings) -> Self {
        let addr = (settings.host.clone(), settings.port);
        match settings.format {
            StatsdFormat::Statsd => Transport::Tcp { addr, stream: None },
            StatsdFormat::DogStatsd => Transport::Udp { addr, socket: None },
        }
    }

    /// Sends `lines`; on failure they are dropped and counted.
    pub(super) async fn send(&mut self, lines: &[String], dropped: &IntCounter) {
        if lines.is_empty() {
            return;
        }
        let result = tokio::time::timeout(IO_TIMEOUT, self.try_send(lines))
            .await
            .unwrap_or_else(|_| Err(io::Error::new(io::ErrorKind::TimedOut, "timed out")));
        if let Err(error) = result {
            // Connected again (and the name looked up again: the agent may have moved) at the
            // next flush.
            match self {
                Transport::Tcp { stream, .. } => *stream = None,
                Transport::Udp { socket, .. } => *socket = None,
            }
            dropped.inc_by(lines.len() as u64);
            static LOGGED: crate::logging::Every =
                crate::logging::Every::new(Duration::from_secs(60));
            if LOGGED.ready() {
                tracing::warn!(%error, lines = lines.len(), "stats dropped: the statsd server did not take them");
            }
        }
    }

    async fn try_send(&mut self, lines: &[String]) -> io::Result<()> {
        match self {
            Transport::Tcp { addr, stream } => {
                if stream.is_none() {
                    let s = tokio::net::TcpStream::connect((addr.0.as_str(), addr.1)).await?;
                    s.set_nodelay(true)?;
                    *stream = Some(s);
                }
                let mut text = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
                for line in lines {
                    text.push_str(line);
                    text.push('\n');
                }
                let s = stream.as_mut().expect("connected above");
                s.write_all(text.as_bytes()).await?;
                s.flush().await
            }
            Transport::Udp { addr, socket } => {
                if socket.is_none() {
                    let target = tokio::net::lookup_host((addr.0.as_str(), addr.1))
                        .await?
                        .next()
                        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))?;
                    let local = if target.is_ipv4() {
                        "0.0.0.0:0"
                    } else {
                        "[::]:0"
                    };
                    let s = tokio::net::UdpSocket::bind(local).await?;
                    s.connect(target).await?;
                    *socket = Some(s);
                }
                let s = socket.as_ref().expect("bound above");
                let mut packet = String::new();
                for line in lines {
                    if !packet.is_empty() && packet.len() + 1 + line.len() > MAX_DATAGRAM {
                        s.send(packet.as_bytes()).await?;
                        packet.clear();
                    }
                    if !packet.is_empty() {
                        packet.push('\n');
                    }
                    packet.push_str(line);
                }
                s.send(packet.as_bytes()).await?;
                Ok(())
            }
        }
    }
}
