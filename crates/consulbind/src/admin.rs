//! The admin HTTP server: `/livez`, `/readyz`, `/metrics` and `/debug/watches`. The debug
//! endpoint lists every tenant's Consul keys, so it answers only on loopback: from the pod
//! itself, or through `kubectl port-forward`.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{
    Json, Router,
    extract::{ConnectInfo, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
};
use prometheus_client::{encoding::text::encode, registry::Registry};
use tokio::net::TcpListener;

use crate::watches::{WatchInfo, Watches};

pub struct Admin {
    pub registry: Registry,
    pub ready: AtomicBool,
    pub watches: Watches,
}

pub async fn serve(listener: TcpListener, admin: Arc<Admin>) -> std::io::Result<()> {
    let app = Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/debug/watches", get(watches))
        .with_state(admin);
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await
}

pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

async fn readyz(State(admin): State<Arc<Admin>>) -> impl IntoResponse {
    if admin.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

async fn metrics(State(admin): State<Arc<Admin>>) -> impl IntoResponse {
    let mut body = String::new();
    match encode(&mut body, &admin.registry) {
        Ok(()) => {
            (StatusCode::OK, [("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], body)
        }
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, [("content-type", "text/plain")], String::new()),
    }
}

async fn watches(State(admin): State<Arc<Admin>>, ConnectInfo(peer): ConnectInfo<SocketAddr>) -> Response {
    if !debug_allowed(&peer) {
        return (StatusCode::NOT_FOUND, "not found").into_response();
    }
    Json::<Vec<WatchInfo>>(admin.watches.list()).into_response()
}

/// Only a client on the same host (or in the same pod) may see the debug endpoints.
fn debug_allowed(peer: &SocketAddr) -> bool {
    match peer.ip() {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(v6.is_loopback(), |v4| v4.is_loopback()),
        ip => ip.is_loopback(),
    }
}

#[cfg(test)]
mod tests {
    use super::debug_allowed;

    #[test]
    fn debug_endpoints_answer_loopback_only() {
        for peer in ["127.0.0.1:1", "127.9.9.9:1", "[::1]:1", "[::ffff:127.0.0.1]:1"] {
            assert!(debug_allowed(&peer.parse().unwrap()), "{peer}");
        }
        for peer in ["10.0.0.7:1", "192.168.1.2:1", "[fd00::1]:1", "[::ffff:10.0.0.7]:1"] {
            assert!(!debug_allowed(&peer.parse().unwrap()), "{peer}");
        }
    }
}
