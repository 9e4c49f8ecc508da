//! Listener plumbing, shared by the gRPC, admin and Prometheus listeners:
//!
//! - [`connection`]: connection caps, handshake deadlines and TCP keepalive;
//! - [`tls`]: TLS and mutual TLS with certificates that follow their files;
//! - [`grpc`]: what a gRPC request's message may cost before a handler sees it;
//! - [`http`]: the bounded HTTP server of the admin and Prometheus listeners;
//! - [`turns`]: the turns of gRPC work, shared fairly between connections.

pub mod connection;
pub mod grpc;
pub mod http;
pub mod tls;
pub mod turns;
