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
        // A line no datagram can hold is dropped alone (and counted), not sent oversized.
        let oversized = match self {
            Transport::Udp { .. } => lines.iter().filter(|l| l.len() > MAX_DATAGRAM).count(),
            Transport::Tcp { .. } => 0,
        };
        if oversized > 0 {
            dropped.inc_by(oversized as u64);
            static OVERSIZED: crate::logging::Every =
                crate::logging::Every::new(Duration::from_secs(60));
            if OVERSIZED.ready() {
                tracing::warn!(
                    lines = oversized,
                    max_bytes = MAX_DATAGRAM,
                    "stats dropped: a line longer than a datagram"
                );
            }
        }
        let result = tokio::time::timeout(IO_TIMEOUT, self.try_send(lines))
            .await
            .unwrap_or_else(|_| {
                Err((
                    io::Error::new(io::ErrorKind::TimedOut, "timed out"),
                    lines.len() - oversized,
                ))
            });
        if let Err((error, lost)) = result {
            // Connected again (and the name looked up again: the agent may have moved) at the
            // next flush.
            match self {
                Transport::Tcp { stream, .. } => *stream = None,
                Transport::Udp { socket, .. } => *socket = None,
            }
            dropped.inc_by(lost as u64);
            static LOGGED: crate::logging::Every =
                crate::logging::Every::new(Duration::from_secs(60));
            if LOGGED.ready() {
                tracing::warn!(%error, lines = lost, "stats dropped: the statsd server did not take them");
            }
        }
    }

    /// Sends `lines`; on failure, the error and how many lines were lost.
    async fn try_send(&mut self, lines: &[String]) -> Result<(), (io::Error, usize)> {
        let all = lines.len();
        match self {
            Transport::Tcp { addr, stream } => {
                let all_lost = |e| (e, all);
                if stream.is_none() {
                    let s = tokio::net::TcpStream::connect((addr.0.as_str(), addr.1))
                        .await
                        .map_err(all_lost)?;
                    s.set_nodelay(true).map_err(all_lost)?;
                    *stream = Some(s);
                }
                let mut text = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
                for line in lines {
                    text.push_str(line);
                    text.push('\n');
                }
                let s = stream.as_mut().expect("connected above");
                s.write_all(text.as_bytes()).await.map_err(all_lost)?;
                s.flush().await.map_err(all_lost)
            }
            Transport::Udp { addr, socket } => {
                let all_lost = |e| (e, all);
                if socket.is_none() {
                    let target = tokio::net::lookup_host((addr.0.as_str(), addr.1))
                        .await
                        .map_err(all_lost)?
                        .next()
                        .ok_or_else(|| {
                            (io::Error::new(io::ErrorKind::NotFound, "no address"), all)
                        })?;
                    let local = if target.is_ipv4() {
                        "0.0.0.0:0"
                    } else {
                        "[::]:0"
                    };
                    let s = tokio::net::UdpSocket::bind(local).await.map_err(all_lost)?;
                    s.connect(target).await.map_err(all_lost)?;
                    *socket = Some(s);
                }
                let s = socket.as_ref().expect("bound above");
                // Each datagram on its own: one that fails loses its own lines only.
                let mut failed: Option<(io::Error, usize)> = None;
                for (packet, count) in datagrams(lines) {
                    if let Err(e) = s.send(packet.as_bytes()).await {
                        let lost = failed.as_ref().map_or(0, |(_, n)| *n) + count;
                        failed = Some((e, lost));
                    }
                }
                match failed {
                    Some(failed) => Err(failed),
                    None => Ok(()),
                }
            }
        }
    }
}

/// `lines` packed into datagrams of at most [`MAX_DATAGRAM`] bytes, with how many lines each
/// holds; a line longer than a datagram is left out (the caller counts it).
fn datagrams(lines: &[String]) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let mut packet = String::new();
    let mut count = 0;
    for line in lines.iter().filter(|l| l.len() <= MAX_DATAGRAM) {
        if count > 0 && packet.len() + 1 + line.len() > MAX_DATAGRAM {
            out.push((std::mem::take(&mut packet), count));
            count = 0;
        }
        if count > 0 {
            packet.push('\n');
        }
        packet.push_str(line);
        count += 1;
    }
    if count > 0 {
        out.push((packet, count));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagrams_keep_their_bound_and_leave_out_only_oversized_lines() {
        let mut lines: Vec<String> = (0..400)
            .map(|i| format!("ratelimit.service.k{i}:1|c"))
            .collect();
        lines.insert(7, "x".repeat(64 * 1024));
        let packets = datagrams(&lines);
        assert!(packets.iter().all(|(p, _)| p.len() <= MAX_DATAGRAM));
        assert_eq!(packets.iter().map(|(_, n)| n).sum::<usize>(), 400);
        let sent: Vec<&str> = packets.iter().flat_map(|(p, _)| p.split('\n')).collect();
        assert_eq!(sent.len(), 400);
        assert!(sent.iter().all(|l| l.len() < 100));
    }
}
