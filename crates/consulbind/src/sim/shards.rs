//! Schedules of a shard ring: replicas that start, crash, stop for a while (a pause, a node
//! that froze) and come back under their names, leave, and lose the API server, with wall
//! clocks a little apart and namespaces pinned and unpinned. Each replica runs the real
//! [`Replica`] and [`Gate`] against a modelled API server that holds the Leases.
//!
//! Invariants, from what the model knows:
//! - at no instant may two replicas write in one namespace: a replica counts as writing where
//!   its gate would let a write through now, a stopped one included, for it may go on the
//!   instant it resumes;
//! - once the replicas run and reach the API server for a while, every namespace has one.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use tokio::{sync::watch, time::Instant};

use super::each_seed;
use crate::{
    Lock,
    shards::{Gate, Leases, Replica, Settings},
};

const LEASE: Duration = Duration::from_secs(15);
const RENEW: Duration = Duration::from_secs(5);
const LOOK: Duration = Duration::from_secs(1);
const NAMESPACES: usize = 16;

/// The API server's Leases, and who cannot reach it.
#[derive(Default)]
struct Api {
    leases: BTreeMap<String, Lease>,
    version: u64,
    cut: Vec<bool>,
}

fn api_error(code: u16) -> kube::Error {
    kube::Error::Api(Box::new(kube::core::Status { code, ..Default::default() }))
}

struct Port {
    api: Arc<Mutex<Api>>,
    who: usize,
    /// Latencies of requests, each way, and when the replica resumes if it is stopped.
    rng: fastrand::Rng,
    stopped: Arc<Mutex<Option<Instant>>>,
}

impl Port {
    /// A request's way to or from the API server: it takes a while, and a stopped replica's
    /// requests wait for it to resume.
    async fn travel(&mut self) {
        tokio::time::sleep(Duration::from_millis(self.rng.u64(0..800))).await;
        let until = *self.stopped.locked();
        if let Some(until) = until {
            tokio::time::sleep_until(until).await;
        }
    }
}

impl Leases for Port {
    async fn list(&mut self) -> kube::Result<Vec<Lease>> {
        self.travel().await;
        let listed = {
            let api = self.api.locked();
            if api.cut[self.who] {
                return Err(api_error(503));
            }
            api.leases.values().cloned().collect()
        };
        self.travel().await;
        Ok(listed)
    }

    async fn write(&mut self, lease: &Lease, create: bool) -> kube::Result<()> {
        self.travel().await;
        {
            let mut api = self.api.locked();
            if api.cut[self.who] {
                return Err(api_error(503));
            }
            let name = lease.metadata.name.clone().unwrap_or_default();
            let held = api.leases.get(&name).and_then(|l| l.metadata.resource_version.clone());
            let fits = match create {
                true => held.is_none(),
                false => held.is_some() && held == lease.metadata.resource_version,
            };
            if !fits {
                return Err(api_error(409));
            }
            api.version += 1;
            let mut stored = lease.clone();
            stored.metadata.resource_version = Some(api.version.to_string());
            api.leases.insert(name, stored);
        }
        self.travel().await;
        Ok(())
    }
}

/// A replica's process: it looks at the ring each second, as `shards::run` does.
struct Process {
    task: tokio::task::JoinHandle<()>,
    lister: tokio::task::JoinHandle<()>,
    gate: Arc<Gate>,
    stopped: Arc<Mutex<Option<Instant>>>,
    exited: Arc<Mutex<bool>>,
}

struct World {
    api: Arc<Mutex<Api>>,
    replicas: Vec<Option<Process>>,
    down_until: Vec<Option<Instant>>,
    skew: Vec<i64>,
    pins: Arc<Mutex<BTreeMap<String, String>>>,
    start: (Instant, Timestamp),
    log: Vec<String>,
    seed: u64,
}

impl World {
    fn at(&self) -> Duration {
        Instant::now() - self.start.0
    }

    fn start_replica(&mut self, who: usize, rng: &mut fastrand::Rng) {
        let settings = Settings {
            namespace: "consulbind".into(),
            ring: "ring".into(),
            identity: format!("r{who}"),
            duration: LEASE,
            renew: RENEW,
        };
        let gate = Gate::new(settings.identity.clone(), LEASE);
        let (views, mut served) = watch::channel(None);
        let (origin, wall) = self.start;
        let skew = self.skew[who];
        let mut replica = Replica::new(settings, gate.clone(), views).with_wall(move || {
            let elapsed = Instant::now().duration_since(origin).as_millis() as i64;
            wall + k8s_openapi::jiff::SignedDuration::from_millis(elapsed + skew)
        });
        let stopped: Arc<Mutex<Option<Instant>>> = Arc::default();
        let exited: Arc<Mutex<bool>> = Arc::default();
        let mut port =
            Port { api: self.api.clone(), who, rng: fastrand::Rng::with_seed(rng.u64(..)), stopped: stopped.clone() };
        let (pins, gone, pause) = (self.pins.clone(), exited.clone(), stopped.clone());
        // The binding cache lists afresh for each view served, which takes a while.
        let (listing, mut list_rng) = (gate.clone(), fastrand::Rng::with_seed(rng.u64(..)));
        let lister = tokio::spawn(async move {
            while served.changed().await.is_ok() {
                let Some(view) = served.borrow_and_update().clone().map(|s| s.view) else { continue };
                tokio::time::sleep(Duration::from_millis(list_rng.u64(0..3_000))).await;
                listing.listed(&view, None);
            }
        });
        let task = tokio::spawn(async move {
            loop {
                let until = *pause.locked();
                if let Some(until) = until {
                    tokio::time::sleep_until(until).await;
                }
                let looked = Instant::now();
                let pins = pins.locked().clone();
                if !replica.look(&mut port, pins).await {
                    *gone.locked() = true;
                    return;
                }
                tokio::time::sleep_until(looked + LOOK).await;
            }
        });
        self.replicas[who] = Some(Process { task, lister, gate, stopped, exited });
        self.down_until[who] = None;
    }

    fn crash(&mut self, who: usize, until: Option<Instant>) {
        if let Some(process) = self.replicas[who].take() {
            process.task.abort();
            process.lister.abort();
        }
        self.down_until[who] = until;
    }

    /// The replicas that could write in `namespace` now.
    fn writers(&self, namespace: &str) -> Vec<usize> {
        let open =
            |p: &Option<Process>| p.as_ref().is_some_and(|p| !*p.exited.locked() && p.gate.enter(namespace).is_ok());
        (0..self.replicas.len()).filter(|who| open(&self.replicas[*who])).collect()
    }

    fn check(&self) {
        for ns in (0..NAMESPACES).map(namespace) {
            let writers = self.writers(&ns);
            assert!(
                writers.len() <= 1,
                "seed {}: replicas {writers:?} may both write in {ns} at {:?}\n{}",
                self.seed,
                self.at(),
                self.log.join("\n")
            );
        }
    }

    /// Lets the replicas run for `span`, checking every 250 ms. A replica that exits is
    /// started again a few seconds later, as its pod would be.
    async fn run(&mut self, span: Duration, rng: &mut fastrand::Rng) {
        let end = Instant::now() + span;
        while Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = Instant::now();
            for who in 0..self.replicas.len() {
                if self.replicas[who].as_ref().is_some_and(|p| *p.exited.locked()) {
                    self.log.push(format!("{:?} r{who} exits: its Lease went unrenewed past its fence", self.at()));
                    self.crash(who, Some(now + Duration::from_millis(rng.u64(1_000..10_000))));
                }
                if self.down_until[who].is_some_and(|until| until <= now) {
                    self.log.push(format!("{:?} r{who} starts again", self.at()));
                    self.start_replica(who, rng);
                }
            }
            self.check();
        }
    }
}

fn namespace(i: usize) -> String {
    format!("team-{i}")
}

fn schedule(seed: u64) {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().expect("a runtime");
    runtime.block_on(async move {
        let mut rng = fastrand::Rng::with_seed(seed);
        let count = rng.usize(2..=4);
        let mut world = World {
            api: Arc::new(Mutex::new(Api { cut: vec![false; count], ..Default::default() })),
            replicas: (0..count).map(|_| None).collect(),
            down_until: vec![None; count],
            skew: (0..count).map(|_| rng.i64(-3_000..=3_000)).collect(),
            pins: Arc::default(),
            start: (Instant::now(), Timestamp::now()),
            log: Vec::new(),
            seed,
        };
        for who in 0..count {
            world.start_replica(who, &mut rng);
        }
        for _ in 0..rng.usize(20..80) {
            let span = Duration::from_millis(rng.u64(100..4_000));
            world.run(span, &mut rng).await;
            let now = Instant::now();
            let who = rng.usize(..count);
            let at = world.at();
            match rng.u8(..12) {
                0 => {
                    world.log.push(format!("{at:?} r{who} crashes"));
                    // Back at once, about when the others find it dead, or later.
                    let down = [rng.u64(0..3_000), rng.u64(13_000..18_000), rng.u64(0..40_000)][rng.usize(..3)];
                    world.crash(who, Some(now + Duration::from_millis(down)));
                }
                1 => {
                    let pause = Duration::from_millis(rng.u64(1_000..30_000));
                    if let Some(process) = &world.replicas[who] {
                        world.log.push(format!("{at:?} r{who} stops for {pause:?}"));
                        *process.stopped.locked() = Some(now + pause);
                    }
                }
                2 => {
                    let mut api = world.api.locked();
                    api.cut[who] = !api.cut[who];
                    world.log.push(format!("{at:?} r{who} cut from the API server: {}", api.cut[who]));
                }
                3 => {
                    if let Some(process) = world.replicas[who].take() {
                        // A graceful stop: the process stops looking, drains, and deletes its Lease.
                        process.task.abort();
                        process.lister.abort();
                        process.gate.drain().await;
                        world.api.locked().leases.remove(&format!("ring-r{who}"));
                        world.log.push(format!("{at:?} r{who} leaves"));
                        world.down_until[who] = Some(now + Duration::from_millis(rng.u64(0..40_000)));
                    }
                }
                4 => {
                    let ns = namespace(rng.usize(..NAMESPACES));
                    let mut pins = world.pins.locked();
                    match rng.bool() {
                        true => pins.insert(ns, format!("r{}", rng.usize(..count + 1))),
                        false => pins.remove(&ns),
                    };
                }
                _ => {}
            }
        }

        // Every replica reaching the API server, running or started again: within three Leases
        // (one for a replica that resumes past its fence to exit and start again), one each.
        world.api.locked().cut.fill(false);
        for who in 0..count {
            match &world.replicas[who] {
                Some(process) => *process.stopped.locked() = None,
                None => world.start_replica(who, &mut rng),
            }
        }
        world.run(LEASE * 3, &mut rng).await;
        for ns in (0..NAMESPACES).map(namespace) {
            assert_eq!(world.writers(&ns).len(), 1, "seed {seed}: {ns} is served by none\n{}", world.log.join("\n"));
        }
    });
}

#[test]
fn schedules_of_a_shard_ring_never_let_two_replicas_write_in_one_namespace() {
    each_seed(schedule);
}
