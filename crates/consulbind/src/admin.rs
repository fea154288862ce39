//! The admin HTTP servers. `/livez`, `/readyz` and `/metrics` answer on `--admin-addr`, for
//! probes and Prometheus. `/debug/watches` lists every tenant's Consul keys and bindings, so it
//! has a listener of its own on `--debug-addr`, loopback by default: a peer address says
//! nothing behind a service-mesh sidecar, where every request arrives from loopback.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{Json, Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use prometheus_client::{encoding::text::encode, registry::Registry};
use tokio::net::TcpListener;

use crate::watches::{WatchInfo, Watches};

pub struct Admin {
    pub registry: Registry,
    pub ready: AtomicBool,
    pub watches: Watches,
}

/// Serves the probes and the metrics.
pub async fn serve(listener: TcpListener, admin: Arc<Admin>) -> std::io::Result<()> {
    let app = Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(admin);
    axum::serve(listener, app).await
}

/// Serves the debug listing, on a listener that should be bound to loopback.
pub async fn serve_debug(listener: TcpListener, admin: Arc<Admin>) -> std::io::Result<()> {
    let app = Router::new().route("/debug/watches", get(watches)).with_state(admin);
    axum::serve(listener, app).await
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

async fn watches(State(admin): State<Arc<Admin>>) -> Json<Vec<WatchInfo>> {
    Json(admin.watches.list())
}
