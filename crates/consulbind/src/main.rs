use consulbind::config::{Config, LogFormat};
use tokio::sync::watch;
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

fn main() {
    limit_malloc_arenas();
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

    tokio::spawn(trim_heap());
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

/// glibc gives each thread that allocates at once an arena of its own, up to eight per core,
/// and memory freed in one is not reused by another: the tokio workers and the blocking pool
/// would hold several half-empty heaps. Two are enough for a process that mostly waits.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a tuning parameter; called before other threads start.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Hands memory freed after a burst (a cold start lists every workload whole) back to the
/// system; glibc keeps it otherwise, and resident memory would stay at the peak.
async fn trim_heap() {
    const EVERY: std::time::Duration = std::time::Duration::from_secs(10);
    loop {
        tokio::time::sleep(EVERY).await;
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim is thread-safe and only releases free memory.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}
