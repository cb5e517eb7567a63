//! `vgpu-certs`: make the webhook's certificates and put the CA where the API server reads it.

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};
use vgpu_certs::plan::{carry_out, decide, Decision, Existing, Wanted};
use vgpu_certs::{inject, pki::Subject, store};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Certificates for the vgpu webhook: generate, renew, inject the CA"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Make (or renew) a CA and a serving certificate for a Service. Only what is missing,
    /// invalid or expiring within --renew-before is regenerated.
    // A flag given twice takes the last value: an operator renews now by appending
    // --renew-before=400d to the chart's CronJob arguments.
    #[command(args_override_self = true)]
    Generate(Generate),
    /// Set the caBundle of the named webhook configurations (mutating and/or validating).
    Inject(Inject),
}

#[derive(Args, Debug)]
struct Generate {
    /// Service name.
    #[arg(long)]
    service: String,
    /// Service namespace.
    #[arg(long)]
    namespace: String,
    /// Directory for ca.crt, ca.key, tls.crt, tls.key (keys 0600). Existing files are reused
    /// while valid.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print a kubernetes.io/tls Secret manifest with this name instead of (or besides) files.
    #[arg(long)]
    secret: Option<String>,
    /// With --secret: read and write the Secret through the API (kubeconfig or in-cluster)
    /// instead of printing it; renews in place like --out does.
    #[arg(long, requires = "secret")]
    apply: bool,
    /// Validity of a new serving certificate, in days.
    #[arg(long, default_value_t = 365)]
    days: u32,
    /// Validity of a new CA, in days.
    #[arg(long, default_value_t = 3650)]
    ca_days: u32,
    /// Renew what expires within this (e.g. 30d, 12h).
    #[arg(long, default_value = "30d", value_parser = parse_duration)]
    renew_before: Duration,
    /// Extra DNS name for the serving certificate (repeatable).
    #[arg(long)]
    dns: Vec<String>,
    /// Extra IP address for the serving certificate (repeatable).
    #[arg(long)]
    ip: Vec<IpAddr>,
}

#[derive(Args, Debug)]
struct Inject {
    /// PEM file of the CA.
    #[arg(long)]
    ca: PathBuf,
    /// Name of a MutatingWebhookConfiguration to give the CA (repeatable).
    #[arg(long = "mutating", required_unless_present = "validating")]
    mutating: Vec<String>,
    /// Name of a ValidatingWebhookConfiguration to give the CA (repeatable).
    #[arg(long = "validating")]
    validating: Vec<String>,
}

/// `30d`, `12h`, `90m`, `45s`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?}: expected a number and a unit (d, h, m, s)"))?;
    let secs = match unit {
        "d" => 86_400,
        "h" => 3_600,
        "m" => 60,
        "s" | "" => 1,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use d, h, m or s)")),
    };
    Ok(Duration::from_secs(n.saturating_mul(secs)))
}

fn describe(d: &Decision) -> String {
    match d {
        Decision::Keep => "certificates valid, nothing to do".into(),
        Decision::NewLeaf(r) => format!("new serving certificate: {r}"),
        Decision::NewCa(r) => format!("new CA and serving certificate: {r}"),
    }
}

async fn generate(g: Generate) -> anyhow::Result<()> {
    if g.out.is_none() && g.secret.is_none() {
        bail!("give --out DIR, --secret NAME, or both");
    }
    let wanted = Wanted {
        subject: Subject {
            service: g.service,
            namespace: g.namespace.clone(),
            extra_dns: g.dns,
            extra_ips: g.ip,
        },
        leaf_days: g.days,
        ca_days: g.ca_days,
        renew_before: g.renew_before,
    };
    let now = SystemTime::now();
    let secret_store = match (&g.secret, g.apply) {
        (Some(name), true) => {
            let client = kube::Client::try_default()
                .await
                .context("connecting to the API server")?;
            Some(store::SecretStore::read(client, &g.namespace, name).await?)
        }
        _ => None,
    };
    let existing = match (&secret_store, &g.out) {
        (Some((_, e)), _) => e.clone(),
        (None, Some(dir)) => store::read_dir(dir)?,
        (None, None) => Existing::default(),
    };
    let decision = decide(&existing, &wanted, now);
    eprintln!("vgpu-certs: {}", describe(&decision));
    let pki = match carry_out(&existing, &decision, &wanted, now)? {
        Some(p) => p,
        None => match (existing.ca, existing.leaf) {
            (Some(ca), Some(leaf)) => vgpu_certs::plan::Pki { ca, leaf },
            _ => bail!("internal: kept an incomplete set"),
        },
    };
    if let Some(dir) = &g.out {
        store::write_dir(dir, &pki)?;
        eprintln!("vgpu-certs: wrote {}", dir.display());
    }
    match (&g.secret, secret_store) {
        (Some(_), Some((s, _))) if decision != Decision::Keep => {
            s.write(&pki).await?;
            eprintln!("vgpu-certs: Secret written");
        }
        (Some(name), None) => print!("{}", store::secret_manifest(name, &g.namespace, &pki)?),
        _ => {}
    }
    Ok(())
}

async fn run_inject(i: Inject) -> anyhow::Result<()> {
    let ca =
        std::fs::read_to_string(&i.ca).with_context(|| format!("reading {}", i.ca.display()))?;
    vgpu_certs::inspect::parse_cert(&ca)
        .with_context(|| format!("{}: not a certificate", i.ca.display()))?;
    let client = kube::Client::try_default()
        .await
        .context("connecting to the API server")?;
    let named = i
        .mutating
        .iter()
        .map(|n| (inject::Kind::Mutating, n))
        .chain(i.validating.iter().map(|n| (inject::Kind::Validating, n)));
    for (kind, name) in named {
        // Someone changed the object between our read and our patch: the resourceVersion test fails
        // (409 Conflict, or 422 for a failed JSON-patch test). Re-read and try again.
        let mut attempt = 0;
        let outcome = loop {
            attempt += 1;
            match inject::inject(client.clone(), kind, name, &ca).await {
                Err(inject::InjectError::Api {
                    source: kube::Error::Api(s),
                    ..
                }) if (s.code == 409 || s.code == 422) && attempt < 5 => continue,
                other => break other?,
            }
        };
        match outcome {
            inject::Outcome::Patched { kind, webhooks } => {
                eprintln!("vgpu-certs: {kind} {name}: caBundle set on {webhooks} webhook(s)")
            }
            inject::Outcome::Unchanged { kind } => {
                eprintln!("vgpu-certs: {kind} {name}: already carries the CA")
            }
        }
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    match Cli::parse().command {
        Command::Generate(g) => generate(g).await,
        Command::Inject(i) => run_inject(i).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("30d").unwrap(),
            Duration::from_secs(30 * 86_400)
        );
        assert_eq!(parse_duration("12h").unwrap(), Duration::from_secs(43_200));
        assert_eq!(parse_duration("5").unwrap(), Duration::from_secs(5));
        assert!(parse_duration("3w").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("d").is_err());
    }

    /// The chart's renewal arguments with one more `--renew-before`: the last one counts.
    #[test]
    fn a_later_renew_before_overrides_the_charts() {
        let cli = Cli::try_parse_from([
            "vgpu-certs",
            "generate",
            "--service=vgpu-webhook",
            "--namespace=vgpu-system",
            "--renew-before=30d",
            "--renew-before=400d",
        ])
        .unwrap();
        let Command::Generate(g) = cli.command else {
            panic!("not generate");
        };
        assert_eq!(g.renew_before, Duration::from_secs(400 * 86_400));
    }
}
