//! A stream's frames on their way from the connection's reader to the caller that reads
//! the stream: bounded, one reader task that sends, one `StreamGuard` that receives.
//!
//! A tokio `mpsc` channel did this before; making one for every request (its shared state,
//! its first block of 32 slots, its semaphore) and freeing it again was ~15 % of the
//! SDK's instructions per point select (callgrind, `scripts/instructions.sh loadgen`).
//! This queue is one small allocation and a mutex that is never contended for long: the
//! sender and the receiver each hold it for a push or a pop.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Poll, Waker};

use osprey_protocol::Frame;

/// Why [`QueueTx::try_send`] gave the frame back.
#[derive(Debug)]
pub(crate) enum TrySendError {
    /// `capacity` frames wait already: wait for [`QueueTx::room`].
    Full(Frame),
    /// The receiver is gone: nobody wants the frame.
    Closed,
}

struct Inner {
    frames: VecDeque<Frame>,
    capacity: usize,
    /// Live [`QueueTx`] handles: at 0, the receiver sees the end once the queue is empty.
    senders: usize,
    receiver_gone: bool,
    /// The receiver waiting for a frame.
    recv_waker: Option<Waker>,
    /// A sender waiting for room.
    room_waker: Option<Waker>,
}

struct Shared(Mutex<Inner>);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding it leaves nothing half-done: a push or a pop either happened or not.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A queue holding at most `capacity` (at least 1) frames.
pub(crate) fn queue(capacity: usize) -> (QueueTx, QueueRx) {
    let shared = Arc::new(Shared(Mutex::new(Inner {
        frames: VecDeque::new(),
        capacity: capacity.max(1),
        senders: 1,
        receiver_gone: false,
        recv_waker: None,
        room_waker: None,
    })));
    (QueueTx(shared.clone()), QueueRx(shared))
}

fn set_waker(slot: &mut Option<Waker>, waker: &Waker) {
    match slot {
        Some(w) if w.will_wake(waker) => {}
        _ => *slot = Some(waker.clone()),
    }
}

pub(crate) struct QueueTx(Arc<Shared>);

impl QueueTx {
    /// Queues `frame` unless the queue is full or its receiver gone.
    pub(crate) fn try_send(&self, frame: Frame) -> Result<(), TrySendError> {
        let waker = {
            let mut q = self.0.lock();
            if q.receiver_gone {
                return Err(TrySendError::Closed);
            }
            if q.frames.len() >= q.capacity {
                return Err(TrySendError::Full(frame));
            }
            q.frames.push_back(frame);
            q.recv_waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    /// Waits until a frame fits: true, or the receiver is gone: false. The reader task is
    /// the only sender, so the room it saw is still there at its `try_send`.
    pub(crate) async fn room(&self) -> bool {
        poll_fn(|cx| {
            let mut q = self.0.lock();
            if q.receiver_gone {
                Poll::Ready(false)
            } else if q.frames.len() < q.capacity {
                Poll::Ready(true)
            } else {
                set_waker(&mut q.room_waker, cx.waker());
                Poll::Pending
            }
        })
        .await
    }
}

impl Clone for QueueTx {
    fn clone(&self) -> Self {
        self.0.lock().senders += 1;
        QueueTx(self.0.clone())
    }
}

impl Drop for QueueTx {
    fn drop(&mut self) {
        let waker = {
            let mut q = self.0.lock();
            q.senders -= 1;
            if q.senders == 0 {
                q.recv_waker.take()
            } else {
                None
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

pub(crate) struct QueueRx(Arc<Shared>);

impl QueueRx {
    /// The next frame; `None` once every sender is gone and the queue is empty.
    /// Cancel-safe: a frame is taken only by the poll that returns it. It spends the
    /// task's cooperative budget as tokio's own channels do, so that a caller draining a
    /// long result the reader keeps feeding still yields to the other tasks of its thread.
    pub(crate) async fn recv(&mut self) -> Option<Frame> {
        poll_fn(|cx| {
            let coop = ready!(tokio::task::coop::poll_proceed(cx));
            let (frame, waker) = {
                let mut q = self.0.lock();
                match q.frames.pop_front() {
                    Some(f) => (f, q.room_waker.take()),
                    None if q.senders == 0 => {
                        coop.made_progress();
                        return Poll::Ready(None);
                    }
                    None => {
                        set_waker(&mut q.recv_waker, cx.waker());
                        return Poll::Pending;
                    }
                }
            };
            coop.made_progress();
            if let Some(w) = waker {
                w.wake();
            }
            Poll::Ready(Some(frame))
        })
        .await
    }
}

impl Drop for QueueRx {
    fn drop(&mut self) {
        let (frames, waker) = {
            let mut q = self.0.lock();
            q.receiver_gone = true;
            (std::mem::take(&mut q.frames), q.room_waker.take())
        };
        // Outside the lock: a frame's bytes may be the last reference to a large buffer.
        drop(frames);
        if let Some(w) = waker {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use osprey_protocol::Kind;

    use super::*;

    /// A wake-up that never comes fails the test instead of hanging it.
    async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(5), f)
            .await
            .expect("not woken within 5 s")
    }

    fn frame(n: u32) -> Frame {
        Frame {
            kind: Kind::Rows,
            flags: 0,
            stream: n,
            payload: Bytes::new(),
        }
    }

    #[tokio::test]
    async fn frames_in_order_then_the_end_once_every_sender_is_gone() {
        let (tx, mut rx) = queue(3);
        let tx2 = tx.clone();
        tx.try_send(frame(1)).unwrap();
        tx2.try_send(frame(2)).unwrap();
        drop(tx);
        assert_eq!(rx.recv().await.map(|f| f.stream), Some(1));
        tx2.try_send(frame(3)).unwrap();
        drop(tx2);
        // What was queued before the last sender left still comes.
        assert_eq!(rx.recv().await.map(|f| f.stream), Some(2));
        assert_eq!(rx.recv().await.map(|f| f.stream), Some(3));
        assert!(rx.recv().await.is_none());
    }

    #[tokio::test]
    async fn full_gives_the_frame_back_and_room_comes_with_a_pop() {
        let (tx, mut rx) = queue(2);
        tx.try_send(frame(1)).unwrap();
        tx.try_send(frame(2)).unwrap();
        let Err(TrySendError::Full(back)) = tx.try_send(frame(3)) else {
            panic!("a third frame in a queue of two")
        };
        assert_eq!(back.stream, 3);
        let waiter = tokio::spawn(async move {
            let room = tx.room().await;
            (room, tx.try_send(back).is_ok())
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "room while the queue is full");
        assert_eq!(rx.recv().await.map(|f| f.stream), Some(1));
        assert_eq!(within(waiter).await.unwrap(), (true, true));
        assert_eq!(rx.recv().await.map(|f| f.stream), Some(2));
        assert_eq!(rx.recv().await.map(|f| f.stream), Some(3));
    }

    #[tokio::test]
    async fn a_gone_receiver_closes_the_queue_and_wakes_a_sender_waiting_for_room() {
        let (tx, rx) = queue(1);
        tx.try_send(frame(1)).unwrap();
        let waiter = tokio::spawn(async move {
            let room = tx.room().await;
            (room, matches!(tx.try_send(frame(2)), Err(TrySendError::Closed)))
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drop(rx);
        assert_eq!(within(waiter).await.unwrap(), (false, true));
    }

    #[tokio::test]
    async fn a_waiting_receiver_is_woken_by_a_frame_and_by_the_last_sender_leaving() {
        let (tx, mut rx) = queue(4);
        let reader = tokio::spawn(async move {
            let first = rx.recv().await.map(|f| f.stream);
            let end = rx.recv().await.is_none();
            (first, end)
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        tx.try_send(frame(7)).unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!reader.is_finished(), "ended while a sender lives");
        drop(tx);
        assert_eq!(within(reader).await.unwrap(), (Some(7), true));
    }

    /// A caller that drains a queue which always has a frame still lets the other tasks
    /// of its thread run (tokio's budget: a yield after 128 ready receives).
    #[tokio::test(flavor = "current_thread")]
    async fn draining_a_full_queue_yields_to_other_tasks() {
        let (tx, mut rx) = queue(1000);
        for n in 0..1000 {
            tx.try_send(frame(n)).unwrap();
        }
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        tokio::spawn(async move { flag.store(true, std::sync::atomic::Ordering::SeqCst) });
        let mut before = None;
        for n in 0..1000 {
            assert!(rx.recv().await.is_some());
            if ran.load(std::sync::atomic::Ordering::SeqCst) {
                before = Some(n);
                break;
            }
        }
        assert!(
            before.is_some(),
            "the other task never ran while 1000 frames were taken"
        );
    }

    /// Cancel-safe: a `recv` dropped before its frame came takes nothing.
    #[tokio::test]
    async fn a_dropped_recv_loses_nothing() {
        let (tx, mut rx) = queue(2);
        assert!(tokio::time::timeout(Duration::from_millis(10), rx.recv())
            .await
            .is_err());
        tx.try_send(frame(5)).unwrap();
        assert_eq!(rx.recv().await.map(|f| f.stream), Some(5));
    }
}
