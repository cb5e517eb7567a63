//! Device health for the kubelet (`DRAResourceHealth.NodeWatchResources`, KEP-4680): the kubelet
//! keeps one stream open per plugin and shows each allocated device's health in the status of the
//! pods that use it (`containerStatuses[].allocatedResourcesStatus`), so a tenant sees that its GPU
//! went bad. The stream sends every GPU at once, again whenever the health watch changes one, and
//! every [`REFRESH`] (the kubelet takes a device whose last update is older than the timeout we
//! give as of unknown health).

use super::health_api as api;
use super::slices::device_name;
use crate::plugin::Shared;
use futures::Stream;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};

/// How often the whole list is sent again without a change.
pub const REFRESH: Duration = Duration::from_secs(30);
/// The timeout given to the kubelet: three refreshes.
const TIMEOUT_SECONDS: i64 = 90;

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The health of every GPU of the node, as the kubelet wants it.
pub fn snapshot(shared: &Shared) -> api::NodeWatchResourcesResponse {
    let pool = shared.settings.node_name.clone();
    let inventory = shared.with_devices(|d| d.inventory(shared.settings.shape));
    let now = unix_now();
    api::NodeWatchResourcesResponse {
        devices: inventory
            .devices
            .iter()
            .map(|d| api::DeviceHealth {
                device: Some(api::DeviceIdentifier {
                    pool_name: pool.clone(),
                    device_name: device_name(d.index),
                }),
                health: if d.healthy {
                    api::HealthStatus::Healthy
                } else {
                    api::HealthStatus::Unhealthy
                } as i32,
                last_updated_time: now,
                health_check_timeout_seconds: TIMEOUT_SECONDS,
                message: if d.healthy {
                    String::new()
                } else {
                    format!(
                        "{} is unhealthy (a critical XID or a failed probe); taint {}",
                        d.uuid,
                        super::UNHEALTHY_TAINT
                    )
                },
            })
            .collect(),
    }
}

/// The service.
#[derive(Clone)]
pub struct HealthService(pub Arc<Shared>);

type Updates = Pin<Box<dyn Stream<Item = Result<api::NodeWatchResourcesResponse, Status>> + Send>>;

#[tonic::async_trait]
impl api::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = Updates;

    async fn node_watch_resources(
        &self,
        _: Request<api::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        let shared = self.0.clone();
        let mut changes = shared.subscribe();
        changes.mark_changed();
        let stream =
            futures::stream::unfold((shared, changes), |(shared, mut changes)| async move {
                tokio::select! {
                    r = changes.changed() => r.ok()?,
                    () = tokio::time::sleep(REFRESH) => {}
                }
                changes.borrow_and_update();
                Some((Ok(snapshot(&shared)), (shared, changes)))
            });
        Ok(Response::new(Box::pin(stream)))
    }
}
