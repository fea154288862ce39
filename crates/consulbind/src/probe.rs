//! `consulbind probe`: what the Helm chart's test pod runs. It asks the controller's `/readyz`
//! and the API server whether it serves ConsulBindings, and says which of the two failed.

use std::time::Duration;

use clap::Parser;
use kube::{Client, Resource};

/// Checks that the controller answers /readyz and that the API server serves ConsulBindings.
#[derive(Parser, Debug)]
#[command(name = "consulbind probe")]
pub struct Args {
    /// The controller's readiness URL, such as http://consulbind-metrics.consulbind-system.svc:8080/readyz.
    #[arg(long)]
    pub url: String,

    /// How long to keep trying before failing: a pod just started may not be ready yet.
    #[arg(long, default_value = "60s", value_parser = consulbind_api::parse_duration)]
    pub within: Duration,
}

/// Runs the probe; the process's exit code.
pub async fn run(args: Args) -> i32 {
    let deadline = tokio::time::Instant::now() + args.within;
    let mut failure;
    loop {
        failure = match ready(&args.url).await {
            Ok(()) => match served().await {
                Ok(resource) => {
                    println!("ok: {} answers, and the API server serves {resource}", args.url);
                    return 0;
                }
                Err(error) => error,
            },
            Err(error) => error,
        };
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    eprintln!("error: {failure}");
    1
}

async fn ready(url: &str) -> Result<(), String> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().map_err(|e| e.to_string())?;
    let response = client.get(url).send().await.map_err(|e| format!("{url}: {e}"))?;
    match response.status() {
        status if status.is_success() => Ok(()),
        status => Err(format!("{url} answered {status}: {}", response.text().await.unwrap_or_default().trim())),
    }
}

/// The ConsulBinding resource, if the API server's discovery lists it.
async fn served() -> Result<String, String> {
    let client = Client::try_default().await.map_err(|e| format!("the API server: {e}"))?;
    let group_version = consulbind_api::ConsulBinding::api_version(&());
    let resources = client
        .list_api_group_resources(&group_version)
        .await
        .map_err(|e| format!("the API server does not serve {group_version}: {e}; is the CRD installed?"))?;
    let plural = consulbind_api::ConsulBinding::plural(&());
    match resources.resources.iter().any(|r| r.name == plural) {
        true => Ok(format!("{plural}.{group_version}")),
        false => Err(format!("the API server serves {group_version} without {plural}; is the CRD current?")),
    }
}
