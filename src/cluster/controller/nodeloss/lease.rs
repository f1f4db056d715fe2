//! Leader election on a coordination.k8s.io/v1 Lease, so more than one controller replica is
//! safe: only the holder acts. Every write replaces the Lease at the resourceVersion it read
//! (a conflict means someone else wrote first), and expiry is judged by this process's clock
//! from when it last saw the Lease change, never by comparing another machine's timestamps.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};

/// What to do with the Lease as last read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// No Lease: create it, held by us.
    Create,
    /// Ours: write a new renew time.
    Renew,
    /// Free or expired: take it over.
    Take,
    /// Another holder's, still valid.
    Follow,
}

/// The Lease as seen through time by one candidate.
#[derive(Debug, Default)]
pub struct Observer {
    /// The resourceVersion last read, and when it was first seen.
    seen: Option<(String, Instant)>,
}

impl Observer {
    /// The step for `lease` (None: it does not exist) read at `now`.
    pub fn step(&mut self, me: &str, lease: Option<&Lease>, now: Instant) -> Step {
        let Some(lease) = lease else {
            self.seen = None;
            return Step::Create;
        };
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        let since = match &self.seen {
            Some((seen, at)) if *seen == version => *at,
            _ => {
                self.seen = Some((version, now));
                now
            }
        };
        let spec = lease.spec.as_ref();
        let holder = spec
            .and_then(|s| s.holder_identity.as_deref())
            .unwrap_or_default();
        if holder == me {
            return Step::Renew;
        }
        let duration = spec
            .and_then(|s| s.lease_duration_seconds)
            .map_or(Duration::ZERO, |s| Duration::from_secs(s.max(0) as u64));
        if holder.is_empty() || now.duration_since(since) >= duration {
            Step::Take
        } else {
            Step::Follow
        }
    }
}

/// One candidate for a Lease.
pub struct Election {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    observer: Observer,
}

fn now_micro() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

impl Election {
    pub fn new(api: Api<Lease>, name: &str, identity: &str, duration: Duration) -> Self {
        Election {
            api,
            name: name.into(),
            identity: identity.into(),
            duration,
            observer: Observer::default(),
        }
    }

    /// Reads the Lease and creates, renews or takes it when this candidate may: true while
    /// this candidate holds it. A write that loses a race is "not leader" until the next try.
    pub async fn try_lead(&mut self) -> Result<bool, kube::Error> {
        let current = self.api.get_opt(&self.name).await?;
        let seconds = i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX);
        let write = match self
            .observer
            .step(&self.identity, current.as_ref(), Instant::now())
        {
            Step::Follow => return Ok(false),
            Step::Create => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(seconds),
                        acquire_time: Some(now_micro()),
                        renew_time: Some(now_micro()),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            step @ (Step::Renew | Step::Take) => {
                let mut lease = current.expect("a step other than Create has a Lease");
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                if step == Step::Take {
                    spec.holder_identity = Some(self.identity.clone());
                    spec.acquire_time = Some(now_micro());
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.lease_duration_seconds = Some(seconds);
                spec.renew_time = Some(now_micro());
                // The resourceVersion read above makes this a compare-and-swap.
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match write {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Gives the Lease up if this candidate holds it, so another replica takes over at once
    /// instead of after the lease duration.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(err) => Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, version: &str, seconds: i32) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("l".into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(Into::into),
                lease_duration_seconds: Some(seconds),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn a_missing_lease_is_created_and_ours_is_renewed() {
        let mut o = Observer::default();
        let t = Instant::now();
        assert_eq!(o.step("me", None, t), Step::Create);
        assert_eq!(
            o.step("me", Some(&lease(Some("me"), "1", 15)), t),
            Step::Renew
        );
    }

    #[test]
    fn a_free_lease_is_taken_at_once() {
        let mut o = Observer::default();
        assert_eq!(
            o.step("me", Some(&lease(None, "1", 15)), Instant::now()),
            Step::Take
        );
        assert_eq!(
            o.step("me", Some(&lease(Some(""), "2", 15)), Instant::now()),
            Step::Take
        );
    }

    #[test]
    fn anothers_lease_expires_only_after_it_stops_changing_for_its_duration() {
        let mut o = Observer::default();
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let held = |v| lease(Some("other"), v, 15);
        assert_eq!(o.step("me", Some(&held("1")), t0), Step::Follow);
        assert_eq!(o.step("me", Some(&held("1")), t0 + s(14)), Step::Follow);
        // Renewed (a new resourceVersion): the clock starts again from when it was seen.
        assert_eq!(o.step("me", Some(&held("2")), t0 + s(14)), Step::Follow);
        assert_eq!(o.step("me", Some(&held("2")), t0 + s(28)), Step::Follow);
        assert_eq!(o.step("me", Some(&held("2")), t0 + s(29)), Step::Take);
    }

    #[test]
    fn a_new_observer_waits_a_full_duration_whatever_the_lease_says() {
        // Another machine's renew time is not trusted: a fresh candidate waits.
        let mut o = Observer::default();
        let t0 = Instant::now();
        assert_eq!(
            o.step("me", Some(&lease(Some("other"), "9", 15)), t0),
            Step::Follow
        );
        assert_eq!(
            o.step(
                "me",
                Some(&lease(Some("other"), "9", 15)),
                t0 + Duration::from_secs(15)
            ),
            Step::Take
        );
    }
}
