use consulbind::config::{Config, LogFormat};
use tokio::sync::watch;
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    // The other commands, before the controller's flags are parsed.
    use clap::Parser;
    match std::env::args_os().nth(1).as_ref().and_then(|a| a.to_str()) {
        Some("migrate") => {
            let args = consulbind::migrate::Args::parse_from(std::env::args_os().skip(1));
            std::process::exit(runtime.block_on(consulbind::migrate::run(args)));
        }
        Some("probe") => {
            let args = consulbind::probe::Args::parse_from(std::env::args_os().skip(1));
            std::process::exit(runtime.block_on(consulbind::probe::run(args)));
        }
        _ => {}
    }
    runtime.block_on(run());
}

async fn run() {
    let config = Config::parse_checked();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    match config.log_format {
        LogFormat::Text => tracing_subscriber::fmt().with_env_filter(filter).init(),
        LogFormat::Json => tracing_subscriber::fmt().json().with_env_filter(filter).init(),
    }

    let (stop, shutdown) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        info!("shutting down");
        let _ = stop.send(true);
    });
    if let Err(error) = consulbind::controller::run(config, shutdown).await {
        error!(%error, "consulbind failed");
        std::process::exit(1);
    }
}

async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// jemalloc: glibc's malloc held a tenth more at 10,000 bindings, in arenas it would not hand
/// back without a periodic trim.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Read by jemalloc when it starts; `_RJEM_MALLOC_CONF` in the environment overrides it. By
/// default it makes four arenas per core of the machine, not of the pod's share: one is enough
/// for a process that mostly waits, each thread's cache taking the contention. Those caches keep
/// blocks of up to 1 KiB, not 32: a cold start's larger ones would stay cached in each thread.
/// Its background thread hands pages back a second after they are freed, not ten: after a
/// burst (a cold start lists every workload whole) resident memory would stay near the peak.
#[cfg(feature = "jemalloc")]
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: Conf =
    Conf(c"narenas:1,tcache_max:1024,background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0".as_ptr());

#[cfg(feature = "jemalloc")]
#[repr(transparent)]
struct Conf(*const std::ffi::c_char);

// SAFETY: it points at a constant, never written.
#[cfg(feature = "jemalloc")]
unsafe impl Sync for Conf {}
