//! Scheduler microbenchmarks: what the dispatcher does per request to pick a
//! worker and to release it, without sockets. Each iteration opens a client
//! stream, builds the job, submits it, takes it off the worker link's channel
//! (or the wait queue), reports the worker done and closes the stream.
//!
//! `cargo bench -p osprey-dispatcher --bench pool -- --warm-up-time 1 --measurement-time 3`
//! Results are recorded in docs/BENCHMARKS.md.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use osprey_dispatcher::metrics::Metrics;
use osprey_dispatcher::pool::wait_queue::{Held, QueueLimits};
use osprey_dispatcher::pool::{Next, SlotGroup, WorkerLink, LINK_JOBS};
use osprey_dispatcher::request::job::Job;
use osprey_dispatcher::request::streams::{outbox, ClientShared, Inbox};
use osprey_protocol::{Frame, Kind};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const WORKERS: u32 = 8;

struct Fixture {
    pool: Arc<SlotGroup>,
    shared: Arc<ClientShared>,
    links: Vec<(u64, mpsc::Receiver<Job>)>,
    frame: Frame,
    // Keeps the client's write queue open.
    _out: Inbox,
}

fn fixture() -> Fixture {
    let metrics = Arc::new(Metrics::new());
    // One client connection that may hold every worker: the cost per request of the
    // fair queue, not its caps, is measured.
    let pool = SlotGroup::new(
        WORKERS as usize,
        QueueLimits::uncapped(1024),
        "bench".into(),
        metrics.clone(),
    );
    pool.set_target(
        "bench",
        osprey_protocol::WorkerSettings {
            backend: osprey_protocol::Backend {
                name: "bench".into(),
                host: "127.0.0.1".into(),
                port: 3306,
                user: "u".into(),
                password: String::new(),
                database: None,
            },
            max_requests: 0,
            max_age_ms: 0,
            batch_rows: 1,
            batch_bytes: 1,
            connect_timeout_ms: 1,
            session_reset: Default::default(),
            backend_tls: None,
        },
    );
    let mut links = Vec::new();
    for index in 0..WORKERS {
        let (kill, _) = mpsc::unbounded_channel();
        let generation = pool.add_slot(index, kill);
        let (jobs, rx) = mpsc::channel(LINK_JOBS);
        let link = WorkerLink {
            jobs,
            quit: CancellationToken::new(),
        };
        assert!(pool.worker_ready(index, generation, link, index));
        links.push((generation, rx));
    }
    let (out, out_rx) = outbox(64, 1 << 20);
    let shared = ClientShared::new(1, out, 1024, 0, 1 << 30, metrics);
    // Jobs are dropped rather than answered here: the guard then only closes its stream.
    shared.closed.store(true, Ordering::Relaxed);
    let frame = Frame {
        kind: Kind::Request,
        flags: 0,
        stream: 0,
        payload: Bytes::from_static(&[0u8; 96]),
    };
    Fixture {
        pool,
        shared,
        links,
        frame,
        _out: out_rx,
    }
}

fn job(f: &Fixture, stream: u32) -> Job {
    let (guard, cancel) = f.shared.open(stream).expect("stream is free");
    let received = Instant::now();
    Job {
        guard,
        cancel,
        frame: f.frame.clone(),
        timeout: None,
        received,
        queue_deadline: received + Duration::from_secs(1),
        attempts: 0,
        digest: None,
        opens: None,
        in_session: false,
        multi_results: false,
        raw_rows: false,
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("pool");

    // Fewer requests than workers: LIFO pick of an idle worker, then back to idle.
    let mut f = fixture();
    group.bench_function("idle worker: submit + done", |b| {
        b.iter(|| {
            let j = job(&f, 7);
            if f.pool.submit(j).is_err() {
                panic!("submit refused");
            }
            // LIFO: the most recently idled worker got it; find its channel.
            let (slot, generation, j) = f
                .links
                .iter_mut()
                .enumerate()
                .find_map(|(i, (g, rx))| rx.try_recv().ok().map(|j| (i as u32, *g, j)))
                .expect("a worker got the job");
            drop(j);
            assert!(matches!(
                f.pool.next_job(slot, generation, Held::Ran(Duration::from_micros(100))),
                Next::Idle
            ));
        })
    });

    // Saturated: every worker busy, so the job waits in the queue and the next
    // worker to finish takes it.
    let mut f = fixture();
    let mut held = Vec::new();
    for stream in 0..WORKERS {
        if f.pool.submit(job(&f, 1000 + stream)).is_err() {
            panic!("submit refused");
        }
    }
    for (_, rx) in f.links.iter_mut() {
        held.push(rx.try_recv().expect("every worker got one"));
    }
    group.bench_function("all busy: queue + take on done", |b| {
        b.iter(|| {
            if f.pool.submit(job(&f, 7)).is_err() {
                panic!("submit refused");
            }
            let (generation, _) = &f.links[3];
            match f.pool.next_job(3, *generation, Held::Ran(Duration::from_micros(100))) {
                Next::Job(j) => drop(j),
                _ => panic!("the queued job was not handed over"),
            }
        })
    });
    drop(held);
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
