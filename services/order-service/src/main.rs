//! `order-service --listen 127.0.0.1:8080`: the stand-in remote services, over HTTP.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use sas_order_service::OrderService;
use tokio::net::TcpListener;
use tracing::{info, warn};
use tracing_subscriber::EnvFilter;

/// How long open requests may take to finish after a shutdown signal.
const GRACE: Duration = Duration::from_secs(10);

/// Inventory, payment and shipping endpoints with idempotency keys, a ledger and fault injection.
#[derive(Parser, Debug)]
#[command(name = "order-service", version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "ORDER_SERVICE_LISTEN", default_value = "127.0.0.1:8080")]
    listen: String,
    /// How long an asynchronous effect (a request with a `callback`) takes before it is confirmed
    /// through the callback queue; it heartbeats meanwhile.
    #[arg(long, env = "ORDER_SERVICE_CONFIRM_AFTER_MS", default_value_t = 3_000)]
    confirm_after_ms: u64,
    /// Refuse (403) every request but `GET /healthz` that is not SigV4-signed with these
    /// credentials (and for this service): `ACCESS_KEY_ID:SECRET_ACCESS_KEY[:service]`.
    #[arg(long, env = "SIGV4_VERIFY", hide_env_values = true)]
    sigv4_verify: Option<String>,
    /// Refuse (401) every request but `GET /healthz` without this value in header `X-Api-Key`.
    #[arg(long, env = "ORDER_SERVICE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .compact()
        .with_ansi(std::io::stdout().is_terminal())
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .init();

    let listener = TcpListener::bind(&args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    info!(addr = %listener.local_addr()?, "order service listening");

    let (signalled_tx, signalled_rx) = tokio::sync::oneshot::channel::<()>();
    let svc = OrderService::with_callbacks(
        std::sync::Arc::new(sas_order_service::SqsSender::default()),
        Duration::from_millis(args.confirm_after_ms),
    );
    if let Some(spec) = args.sigv4_verify.as_deref().filter(|s| !s.is_empty()) {
        let verifier = sas_order_service::sigv4::Verifier::parse(spec).map_err(anyhow::Error::msg)?;
        info!(?verifier, "requests must be SigV4-signed");
        svc.verify_sigv4(Some(verifier));
    }
    if let Some(key) = args.api_key.as_deref().filter(|s| !s.is_empty()) {
        info!("requests must carry X-Api-Key");
        svc.require_header("x-api-key", Some(key));
    }
    let server = svc.serve_with_shutdown(listener, async move {
        shutdown_signal().await;
        info!("shutting down");
        let _ = signalled_tx.send(());
    });
    let grace = async move {
        match signalled_rx.await {
            Ok(()) => tokio::time::sleep(GRACE).await,
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        result = server => result.context("serving")?,
        () = grace => warn!(grace_s = GRACE.as_secs(), "requests still open after the grace period; exiting"),
    }
    info!("stopped");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            warn!(%err, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(err) => {
                warn!(%err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}
