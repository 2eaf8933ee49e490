use std::sync::atomic::Ordering;

use bytes::Bytes;
use osprey_protocol::{ErrorCode, Frame, Kind};

use super::*;
use crate::pool::wait_queue::{Held, HEAVY};
use crate::request::streams::{outbox, ClientShared, Inbox};

struct Fixture {
    pool: Arc<SlotGroup>,
    links: Vec<(u64, mpsc::Receiver<Job>)>,
    conns: Vec<(Arc<ClientShared>, Inbox)>,
}

/// A pool of `workers` registered workers (fake links) and `conns` client
/// connections; connection `i` authenticated with token `tenants[i]` (0 if absent).
fn settings(member: &str) -> WorkerSettings {
    WorkerSettings {
        backend: osprey_protocol::Backend {
            name: member.into(),
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
    }
}

fn fixture(workers: u32, conns: u64, tenants: &[u32], limits: QueueLimits) -> Fixture {
    let metrics = Arc::new(Metrics::new());
    let pool = SlotGroup::new(workers as usize, limits, "test".into(), metrics.clone());
    pool.set_target("m", settings("m"));
    let mut links = Vec::new();
    for index in 0..workers {
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
    let conns = (0..conns)
        .map(|i| {
            let (out, rx) = outbox(64, 1 << 30);
            let shared = ClientShared::new(100 + i, out, 4096, 0, 1 << 30, metrics.clone());
            pool.open_conn(shared.id, tenants.get(i as usize).copied().unwrap_or(0));
            (shared, rx)
        })
        .collect();
    Fixture { pool, links, conns }
}

impl Fixture {
    fn job(&self, conn: usize, stream: u32) -> Job {
        self.job_sized(conn, stream, 16)
    }

    fn job_sized(&self, conn: usize, stream: u32, size: usize) -> Job {
        let (guard, cancel) = self.conns[conn].0.open(stream).expect("stream is free");
        let received = Instant::now();
        Job {
            guard,
            cancel,
            frame: Frame {
                kind: Kind::Request,
                flags: 0,
                stream,
                payload: Bytes::from(vec![0u8; size]),
            },
            timeout: None,
            received,
            queue_deadline: received + Duration::from_secs(60),
            attempts: 0,
            digest: None,
            opens: None,
            in_session: false,
            multi_results: false,
            raw_rows: false,
        }
    }

    fn submit(&self, conn: usize, stream: u32) {
        assert!(self.pool.submit(self.job(conn, stream)).is_ok(), "submit refused");
    }

    /// (slot, job) for every job a worker link received since the last call.
    fn delivered(&mut self) -> Vec<(u32, Job)> {
        let mut got = Vec::new();
        for (i, (_, rx)) in self.links.iter_mut().enumerate() {
            while let Ok(job) = rx.try_recv() {
                got.push((i as u32, job));
            }
        }
        got
    }

    /// The worker of `slot` finished its job, a short one: what it takes next, as
    /// (conn index, stream).
    fn done(&self, slot: u32) -> Option<(usize, u32)> {
        self.ended(slot, Held::Ran(Duration::from_millis(1)))
    }

    /// [`Fixture::done`] for a job that held its worker as `held` says.
    fn ended(&self, slot: u32, held: Held) -> Option<(usize, u32)> {
        match self.pool.next_job(slot, self.links[slot as usize].0, held) {
            Next::Job(j) => Some(self.name(&j)),
            Next::Idle => None,
            Next::Quit | Next::Gone => panic!("slot {slot} must stay"),
        }
    }

    fn name(&self, j: &Job) -> (usize, u32) {
        let conn = self
            .conns
            .iter()
            .position(|(s, _)| s.id == j.conn())
            .expect("known conn");
        (conn, j.stream())
    }
}

fn no_caps() -> QueueLimits {
    QueueLimits::uncapped(1024)
}

#[test]
fn default_cap_leaves_a_quarter_of_the_pool() {
    use crate::pool::wait_queue::default_connection_cap as cap;
    assert_eq!(
        [cap(1), cap(2), cap(3), cap(4), cap(8), cap(10), cap(16)],
        [1, 1, 2, 3, 6, 7, 12]
    );
}

/// One worker, three connections: A queued three jobs while its first ran, before B
/// and C queued theirs; the worker serves B, C (they held no worker: A did), then
/// A, B, A, A in turn, not A's three first.
#[test]
fn connections_are_served_in_turn() {
    let mut f = fixture(1, 3, &[], no_caps());
    f.submit(0, 1); // runs at once
    for s in 2..=4 {
        f.submit(0, s);
    }
    f.submit(1, 1);
    f.submit(1, 2);
    f.submit(2, 1);
    assert_eq!(f.delivered().len(), 1);
    let order: Vec<_> = std::iter::from_fn(|| f.done(0)).collect();
    assert_eq!(order, [(1, 1), (2, 1), (0, 2), (1, 2), (0, 3), (0, 4)]);
    assert_eq!(f.pool.queue_depth(), 0);
}

/// Tokens take turns first: token 0 has two connections, token 1 one; token 1's
/// connection gets every other worker, not a third. (Token 1 and connection 1 go
/// first: they held no worker while connection 0's first job ran.)
#[test]
fn tokens_are_served_in_turn_then_their_connections() {
    let mut f = fixture(1, 3, &[0, 0, 1], no_caps());
    f.submit(0, 100); // occupies the worker
    for s in 1..=3 {
        f.submit(0, s);
        f.submit(1, s);
    }
    for s in 1..=3 {
        f.submit(2, s);
    }
    f.delivered();
    let order: Vec<_> = std::iter::from_fn(|| f.done(0)).collect();
    assert_eq!(
        order,
        [(2, 1), (1, 1), (2, 2), (0, 1), (2, 3), (1, 2), (0, 2), (1, 3), (0, 3)]
    );
}

/// The default cap (pool of 4: 3) holds a connection's fourth job back while a
/// worker is idle; another connection gets that worker at once; a worker of the
/// capped connection that finishes takes its next job, one of another connection
/// that finishes does not.
#[test]
fn a_connection_holds_at_most_its_cap() {
    let mut limits = no_caps();
    limits.max_per_connection = None;
    let mut f = fixture(4, 2, &[], limits);
    for s in 1..=5 {
        f.submit(0, s);
    }
    let running = f.delivered();
    assert_eq!(running.len(), 3, "capped at 3 of 4");
    assert_eq!(f.pool.queue_depth(), 2);
    assert_eq!(f.pool.idle_count(), 1);
    let (view, _) = f.pool.view();
    assert_eq!((view.waiting_connections, view.capped_connections), (1, 1));
    assert_eq!(view.max_per_connection, 3);

    f.submit(1, 1);
    let b = f.delivered();
    assert_eq!(b.len(), 1, "the other connection got the idle worker");
    let b_slot = b[0].0;
    // B's worker finishes: A is at its cap, so it goes idle.
    assert_eq!(f.done(b_slot), None);
    assert_eq!(f.pool.queue_depth(), 2);
    // One of A's workers finishes: it takes A's next job.
    let a_slot = running[0].0;
    assert_eq!(f.done(a_slot), Some((0, 4)));
    // A worker of A is killed: A may have another, and the idle one takes it.
    f.pool.kill(running[1].0, f.links[running[1].0 as usize].0, "test");
    let next = f.delivered();
    assert_eq!(next.len(), 1);
    assert_eq!(f.name(&next[0].1), (0, 5));
    assert_eq!(f.pool.queue_depth(), 0);
}

/// Prefetch takes waiting jobs for a busy worker, charged to their connections as
/// workers they hold (the caps count them); promotion and loss release them.
#[test]
fn prefetched_jobs_count_as_held_and_are_released_in_turn() {
    let mut limits = no_caps();
    limits.max_per_connection = Some(2);
    let mut f = fixture(1, 2, &[], limits);
    let gen = f.links[0].0;
    for s in 1..=4 {
        f.submit(0, s);
    }
    f.submit(1, 1);
    assert_eq!(f.delivered().len(), 1, "the one worker runs A's first");
    // B holds no worker: its job goes behind first. A holds one worker and may hold
    // two: its second goes behind next; then A is at its cap.
    let b1 = f.pool.prefetch(0, gen).expect("B's first");
    assert_eq!(f.name(&b1), (1, 1));
    let a2 = f.pool.prefetch(0, gen).expect("A's second");
    assert_eq!(f.name(&a2), (0, 2));
    assert!(f.pool.prefetch(0, gen).is_none(), "A is at its cap, B has nothing more");
    assert_eq!(f.pool.view().1[0].pipeline, 3);
    assert_eq!(f.pool.outstanding(), Some(2 + 1 + 2), "queued + running + ahead");
    // The running one ends: A's second runs now, and A may have one more behind it.
    assert!(f.pool.promote(0, gen, Held::Ran(Duration::from_millis(1))));
    let a3 = f.pool.prefetch(0, gen).expect("A's third");
    assert_eq!(f.name(&a3), (0, 3));
    assert_eq!(f.pool.view().1[0].pipeline, 3);
    // One taken back (e.g. cancelled) from the middle: its holder is free again.
    f.pool.unprefetch_at(0, gen, 0);
    assert_eq!(f.pool.view().1[0].pipeline, 2);
    // The worker dies: everything it held is released; nothing is lost from the queue.
    f.pool.kill(0, gen, "test");
    assert_eq!(f.pool.queue_depth(), 1, "A's fourth still waits");
    assert_eq!(f.pool.outstanding(), None, "no worker registered");
}

/// A job that opens a session is never written behind another request (prefetch): only
/// an idle worker takes it, and pins itself to the session (review of issue 22: a
/// prefetched opening job reached the worker as a statement and never pinned).
#[test]
fn an_opening_job_is_never_prefetched() {
    let mut f = fixture(2, 2, &[], no_caps());
    let gen0 = f.links[0].0;
    f.submit(0, 1);
    f.submit(0, 2);
    assert_eq!(f.delivered().len(), 2, "both workers busy");
    let mut opening = f.job(1, 1);
    let session = crate::request::session::Session::new(0, 1, "c".into());
    let gate = std::sync::Arc::new(crate::request::session::SessionGate::default());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let place = || {
        rt.block_on(gate.enter(|| 2, 1, Duration::ZERO))
            .unwrap_or_else(|_| panic!("a place"))
    };
    let (permit, conn_permit) = (place(), place());
    let (_queue, jobs) = tokio::sync::mpsc::channel(1);
    opening.opens = Some(Box::new(crate::request::job::Opening {
        session,
        jobs,
        permit,
        conn_permit,
    }));
    assert!(f.pool.submit(opening).is_ok());
    f.submit(0, 3);
    assert!(
        f.pool.prefetch(0, gen0).is_none(),
        "the opening job keeps its turn for an idle worker"
    );
    assert_eq!(f.pool.queue_depth(), 2);
    // A worker that ends its request takes it (as its next job, not behind another).
    match f.pool.next_job(0, gen0, Held::Ran(Duration::from_millis(1))) {
        crate::pool::Next::Job(j) => assert!(j.opens.is_some(), "the opening job, at its turn"),
        _ => panic!("a job"),
    }
}

/// Nothing is written ahead to a worker that is to retire or serves an old target, and
/// promotion says to take back what is ahead then.
#[test]
fn no_prefetch_for_a_retiring_or_retargeted_worker() {
    let mut f = fixture(1, 1, &[], no_caps());
    let gen = f.links[0].0;
    for s in 1..=4 {
        f.submit(0, s);
    }
    assert_eq!(f.delivered().len(), 1);
    assert!(f.pool.prefetch(0, gen).is_some());
    f.pool.quit_requested(0, gen);
    assert!(f.pool.prefetch(0, gen).is_none(), "retiring: it gets no more");
    assert!(
        f.pool.promote(0, gen, Held::Ran(Duration::from_millis(1))),
        "what it has it may still serve"
    );
    f.pool.set_target("other", settings("other"));
    assert!(
        !f.pool.promote(0, gen, Held::Ran(Duration::from_millis(1))),
        "re-targeted: take back what is ahead"
    );
    assert!(f.pool.prefetch(0, gen).is_none());
}

/// Growing the pool grows the default cap: an idle worker takes a capped job.
#[test]
fn resize_lifts_the_default_cap() {
    let mut limits = no_caps();
    limits.max_per_connection = None;
    let mut f = fixture(4, 1, &[], limits);
    for s in 1..=5 {
        f.submit(0, s);
    }
    assert_eq!(f.delivered().len(), 3);
    f.pool.resize(8);
    let more = f.delivered();
    assert_eq!(more.len(), 1, "the idle worker took a job under the larger cap");
    assert_eq!(f.pool.queue_depth(), 1);
    assert_eq!(f.pool.view().0.max_per_connection, 6);
}

/// A token's connections together hold at most max_per_token workers.
#[test]
fn a_token_holds_at_most_its_cap() {
    let mut limits = no_caps();
    limits.max_per_token = 2;
    let mut f = fixture(4, 3, &[0, 0, 1], limits);
    f.submit(0, 1);
    f.submit(1, 1);
    f.submit(1, 2);
    assert_eq!(f.delivered().len(), 2);
    assert_eq!(f.pool.queue_depth(), 1);
    f.submit(2, 1);
    assert_eq!(f.delivered().len(), 1, "token 1 is under its cap");
    assert_eq!(f.pool.idle_count(), 1);
}

/// A job given back by a link whose worker died goes ahead of its connection's
/// later jobs, and its connection first in line (its turn had come).
#[test]
fn requeued_job_goes_first_in_its_connection() {
    let mut f = fixture(1, 2, &[], no_caps());
    f.submit(0, 1);
    let (_, first) = f.delivered().pop().expect("delivered");
    f.submit(0, 2);
    f.submit(1, 1);
    // The worker vanished before the job reached it.
    f.pool.link_lost(0, f.links[0].0, "test", false);
    assert!(f.pool.requeue(first).is_ok());
    assert_eq!(f.pool.queue_depth(), 3);
    let Spawn::Go(generation) = f.pool.begin_spawn(0) else {
        panic!("respawn")
    };
    let (jobs, rx) = mpsc::channel(LINK_JOBS);
    f.links[0] = (generation, rx);
    let link = WorkerLink {
        jobs,
        quit: CancellationToken::new(),
    };
    assert!(f.pool.worker_ready(0, generation, link, 9));
    let got = f.delivered();
    assert_eq!(f.name(&got[0].1), (0, 1));
    assert_eq!(f.done(0), Some((1, 1)));
    assert_eq!(f.done(0), Some((0, 2)));
}

/// Issue 20: four connections keep every worker busy with queued jobs behind; a
/// fifth that holds no worker gets the next one that comes free, whatever its place
/// in line, at each of its requests; and so does a job of it taken back from a
/// worker before it ran.
#[test]
fn a_connection_holding_no_worker_gets_the_next_free_one() {
    let mut f = fixture(4, 5, &[], no_caps());
    for s in 1..=8 {
        for c in 0..4 {
            f.submit(c, s);
        }
    }
    let running = f.delivered();
    assert_eq!(running.len(), 4);
    for round in 0..4u32 {
        f.submit(4, 100 + round);
        // The flooders' workers come free in turn; the first one serves the newcomer.
        let slot = running[round as usize].0;
        assert_eq!(f.done(slot), Some((4, 100 + round)), "round {round}");
        // Its job ends; the worker goes back to the flooders.
        assert!(matches!(f.done(slot), Some((c, _)) if c < 4));
    }
    // Taken back from behind a busy worker: first again at the next free one.
    f.submit(4, 200);
    let gen = f.links[0].0;
    let job = f.pool.prefetch(0, gen).expect("the newcomer's job goes behind");
    assert_eq!(f.name(&job), (4, 200));
    f.pool.unprefetch_at(0, gen, 0);
    assert!(f.pool.requeue(job).is_ok());
    assert_eq!(f.done(1), Some((4, 200)));
}

/// A connection in line behind others, whose worker comes free meanwhile, moves up
/// to the first class (it holds none now) without losing its later turn.
#[test]
fn a_connection_whose_worker_comes_free_moves_up() {
    let mut f = fixture(2, 3, &[], no_caps());
    f.submit(0, 1); // A runs
    f.submit(1, 1); // B runs
    f.submit(0, 2); // A waits, holding one: second class
    f.submit(1, 2); // B too, behind A
    f.submit(2, 1); // C holds none: first class
    let running = f.delivered();
    let slot_of = |conn: usize| running.iter().find(|(_, j)| f.name(j).0 == conn).unwrap().0;
    let (a, b) = (slot_of(0), slot_of(1));
    // B's worker ends: C first (it held none before B did); then B, which holds none
    // now, ahead of A, which still does.
    assert_eq!(f.done(b), Some((2, 1)));
    assert_eq!(f.done(b), Some((1, 2)));
    assert_eq!(f.done(a), Some((0, 2)));
    assert_eq!(f.done(a), None);
    assert_eq!(f.done(b), None);
    assert_eq!(f.pool.queue_depth(), 0);
}

/// Issue 20: a connection whose last request held its worker for `HEAVY` gets nothing
/// written behind its requests, and its own are not written behind another's; it
/// keeps its turn for the next free worker.
#[test]
fn nothing_is_prefetched_behind_or_for_a_heavy_connection() {
    let mut f = fixture(2, 2, &[], no_caps());
    f.submit(0, 1);
    let (a_slot, _) = f.delivered().pop().expect("A runs");
    assert_eq!(f.ended(a_slot, Held::Ran(HEAVY)), None, "A's first ran for HEAVY");
    f.submit(0, 2); // A runs again, on an idle worker
    f.submit(1, 1); // B too
    let running = f.delivered();
    let slot_of = |conn: usize| running.iter().find(|(_, j)| f.name(j).0 == conn).unwrap().0;
    let (a, b) = (slot_of(0), slot_of(1));
    f.submit(0, 3); // A waits, first in line
    f.submit(1, 2); // B waits behind it
    assert!(
        f.pool.prefetch(a, f.links[a as usize].0).is_none(),
        "nothing behind A's request"
    );
    assert!(
        f.pool.prefetch(b, f.links[b as usize].0).is_none(),
        "A's request is not written behind B's"
    );
    assert_eq!(f.pool.queue_depth(), 2);
    // B's worker comes free: B, light and holding none now, goes first; A, heavy,
    // kept its place in the other class and is next.
    assert_eq!(f.done(b), Some((1, 2)));
    assert_eq!(f.done(a), Some((0, 3)));
    // A's second was short: A is light again, and what waits may go behind its third.
    f.submit(1, 3);
    let ahead = f
        .pool
        .prefetch(a, f.links[a as usize].0)
        .expect("B's third goes behind A's");
    assert_eq!(f.name(&ahead), (1, 3));
}

/// Heaviness is the worker's measure of the request, not the dispatcher's clock: a
/// `SELECT 1` whose END the dispatcher read late (the machine stalled it) leaves its
/// connection light. Judged from the pick to the END, one stall put the next request of
/// a client with one short query at a time behind every flooder in turn (CI saw 0.6 s).
#[test]
fn a_late_end_does_not_make_a_short_request_heavy() {
    let mut f = fixture(1, 1, &[], no_caps());
    let id = f.conns[0].0.id;
    f.submit(0, 1);
    let (slot, _) = f.delivered().pop().expect("A runs");
    std::thread::sleep(HEAVY + Duration::from_millis(10));
    f.ended(slot, Held::Ran(Duration::from_millis(1)));
    assert!(!f.pool.lock().queue.is_heavy(id), "it ran for 1 ms");
    // The worker's measure says heavy: heavy, however soon the END came.
    f.submit(0, 2);
    let (slot, _) = f.delivered().pop().expect("A runs again");
    f.ended(slot, Held::Ran(HEAVY));
    assert!(f.pool.lock().queue.is_heavy(id), "it ran for HEAVY");
}

/// A request written behind another (prefetch) holds its worker from when it becomes
/// the worker's current one, not from when it was written: its wait behind the other
/// is not its weight. And one that never ran leaves its connection's judgement as it was.
#[test]
fn a_prefetched_request_is_judged_from_its_start() {
    let mut f = fixture(1, 2, &[], no_caps());
    let gen = f.links[0].0;
    let b = f.conns[1].0.id;
    f.submit(0, 1);
    f.submit(1, 1);
    assert_eq!(f.delivered().len(), 1, "A's first runs");
    let b1 = f.pool.prefetch(0, gen).expect("B's first goes behind it");
    assert_eq!(f.name(&b1), (1, 1));
    std::thread::sleep(HEAVY + Duration::from_millis(10));
    assert!(
        f.pool.promote(0, gen, Held::Ran(Duration::from_millis(1))),
        "B's is current now"
    );
    // No END from the worker for B's (its statement was cancelled and drained, say): the
    // time since it became current, a moment.
    assert_eq!(f.ended(0, Held::SinceStart), None);
    assert!(
        !f.pool.lock().queue.is_heavy(b),
        "B's waited behind A's, but ran for a moment"
    );

    // B heavy now; its next, written behind A's, is taken back before it ran: B stays heavy.
    f.submit(1, 2);
    let (_, b2) = f.delivered().pop().expect("B's second runs");
    assert_eq!(f.name(&b2), (1, 2));
    assert_eq!(f.ended(0, Held::Ran(HEAVY)), None);
    assert!(f.pool.lock().queue.is_heavy(b));
    f.submit(0, 2);
    f.delivered();
    f.submit(1, 3);
    assert!(f.pool.prefetch(0, gen).is_some(), "B alone waits: behind A's second");
    f.pool.unprefetch(0, gen);
    assert!(f.pool.lock().queue.is_heavy(b), "a request that never ran says nothing");
    // The worker is lost with A's second running: no END, so A's second held it from
    // its start until now.
    let a = f.conns[0].0.id;
    assert!(!f.pool.lock().queue.is_heavy(a));
    std::thread::sleep(HEAVY + Duration::from_millis(10));
    f.pool.kill(0, gen, "test");
    assert!(f.pool.lock().queue.is_heavy(a), "A's second held its worker past HEAVY");
}

#[test]
fn cancel_and_close_take_waiting_jobs() {
    let mut f = fixture(1, 2, &[], no_caps());
    f.submit(0, 1);
    for s in 2..=4 {
        f.submit(0, s);
    }
    f.submit(1, 1);
    f.delivered();
    assert_eq!(f.pool.take_waiting(f.conns[0].0.id, 3).map(|j| j.stream()), Some(3));
    assert_eq!(f.pool.take_waiting_conn(f.conns[0].0.id).len(), 2);
    assert_eq!(f.pool.queue_depth(), 1);
    let (view, _) = f.pool.view();
    assert_eq!(view.waiting_connections, 1);
    assert_eq!(f.done(0), Some((1, 1)));
    assert_eq!(f.done(0), None);
}

/// The byte bounds: the whole queue, and each connection's share; a single job
/// larger than a bound is taken when nothing else waits there.
#[test]
fn queue_is_bounded_in_bytes() {
    let mut limits = no_caps();
    limits.bytes = 1000;
    limits.bytes_per_connection = 400;
    let mut f = fixture(1, 3, &[], limits);
    f.submit(0, 1); // runs
    f.delivered();
    assert!(f.pool.submit(f.job_sized(0, 2, 300)).is_ok());
    let e = f.pool.submit(f.job_sized(0, 3, 300)).err().map(|(_, e)| e);
    assert_eq!(e, Some(SubmitError::ConnectionQueueFull));
    assert!(f.pool.submit(f.job_sized(1, 1, 2000)).is_err(), "over the whole bound");
    assert!(f.pool.submit(f.job_sized(1, 2, 400)).is_ok());
    assert!(f.pool.submit(f.job_sized(2, 1, 300)).is_ok());
    let e = f.pool.submit(f.job_sized(2, 2, 1)).err().map(|(_, e)| e);
    assert_eq!(e, Some(SubmitError::QueueFull));
    assert_eq!(f.pool.view().0.queue_bytes, 1000);
    // Alone in an empty queue, a job larger than both bounds waits all the same.
    f.pool.take_waiting_conn(f.conns[0].0.id);
    f.pool.take_waiting_conn(f.conns[1].0.id);
    f.pool.take_waiting_conn(f.conns[2].0.id);
    let (out, rx) = outbox(4, 1 << 30);
    let shared = ClientShared::new(7, out, 4, 0, 1 << 30, Arc::new(Metrics::new()));
    f.conns.push((shared, rx));
    assert!(f.pool.submit(f.job_sized(3, 1, 5000)).is_ok());
    assert_eq!(f.pool.queue_depth(), 1);
}

/// The hold ends with the member it was on (the primary came back, no failover):
/// slot tasks backing off after their workers failed to connect must wake, or writes
/// wait out the back-off (up to respawn_backoff_max_ms, beyond queue_timeout_ms).
#[test]
fn end_of_hold_wakes_slots_backing_off() {
    let f = fixture(1, 1, &[], no_caps());
    let mut target = f.pool.target_changes();
    target.borrow_and_update();
    f.pool.hold("primary m is down".into());
    f.pool.set_target("m", settings("m"));
    assert!(
        target.has_changed().unwrap(),
        "slot tasks not woken at the end of the hold"
    );
    // Not on every call with nothing to end (the follower calls it on every wake-up).
    target.borrow_and_update();
    f.pool.set_target("m", settings("m"));
    assert!(!target.has_changed().unwrap());
    // And at the end of "every member is down".
    f.pool.set_unavailable("every member is down".into());
    f.pool.set_target("m", settings("m"));
    assert!(target.has_changed().unwrap(), "not woken after unavailable");
}

/// Every member is down: a job given back by a link whose worker vanished before it
/// got it fails at once (BACKEND_UNAVAILABLE, not dispatched) like every waiting one,
/// instead of waiting out its queue deadline behind the hold.
#[test]
fn requeue_while_unavailable_fails_at_once() {
    let mut f = fixture(1, 1, &[], no_caps());
    f.submit(0, 1);
    let (_, job) = f.delivered().pop().expect("delivered");
    f.pool.set_unavailable("every member is down".into());
    f.pool.link_lost(0, f.links[0].0, "test", true);
    let e = f.pool.requeue(job).err().map(|(_, e)| e);
    assert_eq!(e, Some(SubmitError::Unavailable));
    assert_eq!(f.pool.queue_depth(), 0);
}

/// A re-target that falls between `begin_spawn` and `set_pid` (the fork) finds the
/// slot without a pid, so it sends no kill; the process it is about to get was
/// started for the old member and must be killed when its pid is known, not left to
/// connect to the old member for up to register + connect timeout.
#[test]
fn retarget_during_spawn_kills_the_new_process() {
    let f = fixture(1, 0, &[], no_caps());
    let (kill, mut kill_rx) = mpsc::unbounded_channel();
    f.pool.add_slot(7, kill);
    let Spawn::Go(generation) = f.pool.begin_spawn(7) else {
        panic!("spawn")
    };
    f.pool.set_target("n", settings("n"));
    assert!(kill_rx.try_recv().is_err(), "no process to kill yet");
    f.pool.set_pid(7, generation, 4242);
    assert!(kill_rx.try_recv().is_ok(), "stale process not killed");
    // A process of the current target is left alone.
    let Spawn::Go(generation) = f.pool.begin_spawn(7) else {
        panic!("respawn")
    };
    f.pool.set_pid(7, generation, 4243);
    assert!(kill_rx.try_recv().is_err());
}

// Following the primary: paths a review found right, kept as regression tests.

/// A hold ended by `set_target` with the same member hands the waiting jobs to the
/// workers that went idle during it.
#[test]
fn the_end_of_a_hold_dispatches_what_waited() {
    let mut f = fixture(2, 1, &[], no_caps());
    f.submit(0, 1);
    let (busy, _) = f.delivered().pop().expect("delivered");
    f.pool.hold("switch in progress".into());
    for s in 2..=4 {
        f.submit(0, s);
    }
    assert_eq!(f.done(busy), None, "no dispatch during the hold");
    assert!(f.delivered().is_empty());
    assert_eq!((f.pool.queue_depth(), f.pool.idle_count()), (3, 2));
    f.pool.set_target("m", settings("m"));
    assert_eq!(f.delivered().len(), 2);
    assert_eq!(f.pool.queue_depth(), 1);
}

/// A new member: the idle worker is told to quit at once, the busy one after its
/// response, and a worker spawned for the old member that registers late is told
/// to quit and gets no job.
#[test]
fn a_new_target_retires_old_workers() {
    let mut f = fixture(2, 1, &[], no_caps());
    f.submit(0, 1);
    let (busy, _) = f.delivered().pop().expect("delivered");
    let (kill, _kill_rx) = mpsc::unbounded_channel();
    f.pool.add_slot(9, kill);
    let Spawn::Go(late) = f.pool.begin_spawn(9) else {
        panic!("spawn")
    };
    let idle_quit = CancellationToken::new();
    // (Re-register the idle worker with a quit token the test can see.)
    let idle = 1 - busy;
    f.pool.kill(idle, f.links[idle as usize].0, "test");
    let Spawn::Go(generation) = f.pool.begin_spawn(idle) else {
        panic!("respawn")
    };
    let (jobs, rx) = mpsc::channel(LINK_JOBS);
    f.links[idle as usize] = (generation, rx);
    let link = WorkerLink {
        jobs,
        quit: idle_quit.clone(),
    };
    assert!(f.pool.worker_ready(idle, generation, link, 1));

    f.pool.set_target("n", settings("n"));
    assert!(idle_quit.is_cancelled(), "idle worker not told to quit");
    assert!(matches!(
        f.pool
            .next_job(busy, f.links[busy as usize].0, Held::Ran(Duration::from_millis(1))),
        Next::Quit
    ));
    let (jobs, mut late_rx) = mpsc::channel(LINK_JOBS);
    let late_quit = CancellationToken::new();
    let link = WorkerLink {
        jobs,
        quit: late_quit.clone(),
    };
    assert!(f.pool.worker_ready(9, late, link, 2));
    assert!(
        late_quit.is_cancelled(),
        "late worker of the old member not told to quit"
    );
    f.submit(0, 2);
    assert!(late_rx.try_recv().is_err());
    assert!(f.delivered().is_empty());
    assert_eq!(f.pool.queue_depth(), 1);
    let (view, _) = f.pool.view();
    assert_eq!((view.quitting, view.idle, view.busy), (3, 0, 0));
}

/// Unavailable: waiting requests fail at once and new ones are refused.
#[test]
fn unavailable_fails_waiting_and_new_requests() {
    let f = fixture(1, 1, &[], no_caps());
    f.submit(0, 1);
    f.submit(0, 2);
    f.submit(0, 3);
    assert_eq!(f.pool.queue_depth(), 2);
    f.pool.set_unavailable("every member is down".into());
    assert_eq!(f.pool.queue_depth(), 0);
    let e = f.pool.submit(f.job(0, 4)).err().map(|(_, e)| e);
    assert_eq!(e, Some(SubmitError::Unavailable));
    // A member is back, but not the primary: requests wait again.
    f.pool.hold("primary m is down".into());
    f.submit(0, 5);
    assert_eq!(f.pool.queue_depth(), 1);
}

/// Two groups share the gauges: each adds its own counts.
#[test]
fn gauges_add_up_over_groups() {
    let metrics = Arc::new(Metrics::new());
    let groups: Vec<_> = (0..2)
        .map(|g| SlotGroup::with_base(g, 0, no_caps(), format!("c{g}"), metrics.clone()))
        .collect();
    for (g, pool) in groups.iter().enumerate() {
        pool.set_target("m", settings("m"));
        for index in pool.resize(2 + g) {
            assert!(pool.owns(index) && index / GROUP_SLOTS == g as u32);
            let (kill, _) = mpsc::unbounded_channel();
            pool.add_slot(index, kill);
        }
    }
    let starting = metrics.slot_state(SlotState::Starting.name());
    assert_eq!(starting.get(), 5);
    let (kill, _) = mpsc::unbounded_channel();
    let generation = groups[1].add_slot(GROUP_SLOTS, kill);
    let (jobs, _rx) = mpsc::channel(LINK_JOBS);
    let link = WorkerLink {
        jobs,
        quit: CancellationToken::new(),
    };
    assert!(groups[1].worker_ready(GROUP_SLOTS, generation, link, 1));
    assert_eq!(starting.get(), 4);
    assert_eq!(metrics.slot_state(SlotState::Idle.name()).get(), 1);
    groups[0].hold("h".into());
    let (out, _inbox) = outbox(4, 1 << 30);
    let shared = ClientShared::new(1, out, 4, 0, 1 << 30, metrics.clone());
    groups[0].open_conn(1, 0);
    let (guard, cancel) = shared.open(1).expect("stream");
    let received = Instant::now();
    let job = Job {
        guard,
        cancel,
        frame: Frame {
            kind: Kind::Request,
            flags: 0,
            stream: 1,
            payload: Bytes::from_static(b"x"),
        },
        timeout: None,
        received,
        queue_deadline: received + Duration::from_secs(60),
        attempts: 0,
        digest: None,
        opens: None,
        in_session: false,
        multi_results: false,
        raw_rows: false,
    };
    assert!(groups[0].submit(job).is_ok());
    assert_eq!(metrics.queue_depth.get(), 1);
    groups[1].shutdown();
    assert_eq!(
        metrics.queue_depth.get(),
        1,
        "another group's shutdown keeps this queue"
    );
    groups[0].shutdown();
    assert_eq!(metrics.queue_depth.get(), 0);
}

/// Jobs past their queue deadline fail (QUEUE_TIMEOUT), in every connection.
#[tokio::test]
async fn reaper_expires_jobs_of_every_connection() {
    let mut f = fixture(1, 3, &[], no_caps());
    f.submit(0, 1);
    f.delivered();
    let soon = Instant::now() + Duration::from_millis(20);
    for (conn, stream) in [(0, 2), (1, 1), (2, 1), (1, 2)] {
        let mut j = f.job(conn, stream);
        j.queue_deadline = soon;
        assert!(f.pool.submit(j).is_ok());
    }
    f.submit(2, 2); // a deadline a minute away
    let reaper = tokio::spawn(f.pool.clone().run_reaper());
    let t0 = Instant::now();
    while f.pool.queue_depth() > 1 {
        assert!(t0.elapsed() < Duration::from_secs(5), "jobs not expired");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    reaper.abort();
    assert_eq!(f.done(0), Some((2, 2)));
    // Each expired job got its ERROR QUEUE_TIMEOUT.
    for (conn, want) in [(0usize, 1usize), (1, 2), (2, 1)] {
        let rx = &mut f.conns[conn].1;
        let mut errors = 0;
        let t0 = Instant::now();
        while errors < want && t0.elapsed() < Duration::from_secs(5) {
            match rx.try_recv().map(|q| q.frame) {
                // (Jobs the test drops itself end with INTERNAL.)
                Some(fr) if fr.kind == Kind::Error => {
                    let body: osprey_protocol::ErrorBody = fr.body().expect("ERROR body");
                    errors += usize::from(body.code == ErrorCode::QueueTimeout);
                }
                Some(_) => {}
                None => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
        assert_eq!(errors, want, "connection {conn}");
    }
    assert!(!f.conns[0].0.closed.load(Ordering::Relaxed));
}

/// After kill -9 of the primary, each idle worker still holds a dead session: without
/// this, the next requests would meet them one by one, each ending outcome-unknown.
#[test]
fn a_lost_session_retires_the_other_idle_sessions_of_its_member() {
    let mut f = fixture(3, 1, &[], no_caps());
    f.submit(0, 1);
    let (slot, _job) = f.delivered().pop().expect("delivered");
    f.pool.session_lost(slot, f.links[slot as usize].0);
    let (view, _) = f.pool.view();
    assert_eq!((view.idle, view.busy, view.quitting), (0, 1, 2), "{view:?}");
    // The next request waits for a fresh worker instead of meeting a dead session.
    f.submit(0, 2);
    assert!(f.delivered().is_empty());
    assert_eq!(f.pool.queue_depth(), 1);
}

/// A request in flight on a primary that failed over (killed or cut off) is never
/// answered by it: its worker is killed so that the request ends now (WORKER_LOST),
/// not at request_timeout.
#[test]
fn abandoning_a_member_kills_its_busy_workers_only() {
    let mut f = fixture(3, 1, &[], no_caps());
    f.submit(0, 1);
    assert_eq!(f.delivered().len(), 1);
    let kills = f.pool.metrics.worker_kills.get();
    f.pool.abandon_member("other");
    assert_eq!(f.pool.view().0.busy, 1, "another member's name abandons nothing");
    f.pool.abandon_member("m");
    let (view, _) = f.pool.view();
    assert_eq!((view.busy, view.idle, view.starting), (0, 2, 1), "{view:?}");
    assert_eq!(f.pool.metrics.worker_kills.get(), kills + 1);
}
