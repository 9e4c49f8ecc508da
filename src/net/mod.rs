//! Listener plumbing, shared by the gRPC, admin and Prometheus listeners:
//!
//! - [`connection`]: connection caps, handshake deadlines and TCP keepalive;
//! - [`tls`]: TLS and mutual TLS with certificates that follow their files;
//! - [`http`]: the bounded HTTP server of the admin and Prometheus listeners.

pub mod connection;
pub mod http;
pub mod tls;
