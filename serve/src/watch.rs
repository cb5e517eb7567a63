//! The one watch loop of the services: every cache that follows the API server (the scheduler's
//! nodes and pods, the webhook's quotas, pods, nodes and DRA objects, the device plugin's pods on
//! its node) is a [`Feed`] driven by [`watch_forever`].
//!
//! kube-runtime's watcher LISTs, then WATCHes from the list's resourceVersion, re-LISTs on 410
//! Gone, and backs off on errors (0.8 s doubling to 30 s). A (re-)LIST arrives as `Init`,
//! `InitApply`..., `InitDone`, told to the feed as [`Feed::relist`], [`Feed::listed`]...,
//! [`Feed::synced`]: what was not listed is gone, the way a reflector's store is replaced. A
//! watch that fails after its LIST was complete may have missed events: the feed is told
//! ([`Feed::failed`] with `complete`) so it can count itself unsynced, and the loop starts over
//! from a fresh LIST after a pause ([`RESTART_MIN`] doubling to [`RESTART_MAX`]).

use std::fmt::Debug;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// Pause before a watch that failed after its LIST was complete starts over; it doubles on each
/// restart up to [`RESTART_MAX`], and is back to this after a run that stayed healthy for
/// [`RESTART_RESET`].
pub const RESTART_MIN: Duration = Duration::from_millis(250);
/// The longest pause between two restarts.
pub const RESTART_MAX: Duration = Duration::from_secs(30);
/// How long a run must stay healthy for the pause to start again from [`RESTART_MIN`].
pub const RESTART_RESET: Duration = Duration::from_secs(60);

/// A cache fed by one watch.
pub trait Feed<K>: Send {
    /// A (re-)LIST begins: the objects told to [`Feed::listed`] until [`Feed::synced`] are the
    /// whole set.
    fn relist(&mut self);
    /// One object of the LIST.
    fn listed(&mut self, object: K);
    /// The LIST is complete: objects it did not carry are gone.
    fn synced(&mut self);
    /// An object was added or modified.
    fn applied(&mut self, object: K);
    /// An object was deleted.
    fn deleted(&mut self, object: K);
    /// The watch failed. `complete`: after a complete LIST, so events may have been missed and
    /// a fresh LIST follows; else while listing, which kube-runtime retries with backoff.
    fn failed(&mut self, error: &watcher::Error, complete: bool) {
        let _ = (error, complete);
    }
}

/// Feeds `feed` from a watch of `api` with `config` until the process ends. `what` names the
/// watch in logs.
pub async fn watch_forever<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    mut feed: impl Feed<K>,
) where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
{
    let mut pause = RESTART_MIN;
    loop {
        let started = Instant::now();
        watch_until_failure(&api, &config, what, &mut feed).await;
        pause = if started.elapsed() > RESTART_RESET {
            RESTART_MIN
        } else {
            (pause * 2).min(RESTART_MAX)
        };
        // Not a test sleep: the backoff between two full LISTs of a failing watch.
        tokio::time::sleep(pause).await;
    }
}

/// One watcher from a fresh LIST until it fails after its LIST was complete, or its stream ends.
async fn watch_until_failure<K>(
    api: &Api<K>,
    config: &watcher::Config,
    what: &'static str,
    feed: &mut impl Feed<K>,
) where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
{
    let mut stream = watcher::watcher(api.clone(), config.clone())
        .default_backoff()
        .boxed();
    let mut complete = false;
    let mut listed = 0usize;
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => {
                listed = 0;
                feed.relist();
            }
            Ok(Event::InitApply(o)) => {
                listed += 1;
                feed.listed(o);
            }
            Ok(Event::InitDone) => {
                feed.synced();
                complete = true;
                tracing::info!(watch = what, objects = listed, "list synced");
            }
            Ok(Event::Apply(o)) => feed.applied(o),
            Ok(Event::Delete(o)) => feed.deleted(o),
            Err(e) => {
                feed.failed(&e, complete);
                if complete {
                    tracing::warn!(watch = what, error = %e, "watch failed; cache marked unsynced, re-listing");
                    return;
                }
                tracing::warn!(watch = what, error = %e, "listing failed; retrying");
            }
        }
    }
}
