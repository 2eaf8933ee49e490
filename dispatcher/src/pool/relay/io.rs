//! Writes to the worker, each bounded by `keepalive_timeout` (a worker that does not
//! read is hung).

use futures::SinkExt;
use osprey_protocol::{Cancel, Frame, Kind, Ping};
use tokio::time::{timeout, Instant as TokioInstant};

use super::*;

impl Relay {
    pub(super) async fn ping(&mut self) -> Result<(), LinkError> {
        self.nonce += 1;
        let ping = Ping { nonce: self.nonce };
        self.write(Frame::new(Kind::Ping, 0, &ping)).await
    }

    pub(super) async fn send_cancel(&mut self, cur: &mut Current) -> Result<(), LinkError> {
        if cur.cancel_sent {
            return Ok(());
        }
        cur.cancel_sent = true;
        cur.deadline = cur.deadline.min(later(TokioInstant::now(), self.grace()));
        let cancel = Cancel {
            reason: "client".into(),
        };
        self.write(Frame::new(Kind::Cancel, cur.wstream, &cancel)).await
    }

    /// Queues a control frame for the next [`Relay::flush`].
    pub(super) async fn feed(&mut self, frame: Frame) -> Result<(), LinkError> {
        match timeout(self.env.bounds.keepalive_timeout, self.writer.feed(frame)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(LinkError::WorkerClosed),
            Err(_) => Err(LinkError::NotReading),
        }
    }

    pub(super) async fn flush(&mut self) -> Result<(), LinkError> {
        match timeout(
            self.env.bounds.keepalive_timeout,
            SinkExt::<Frame>::flush(&mut self.writer),
        )
        .await
        {
            Ok(Ok(())) => {
                self.unflushed = false;
                Ok(())
            }
            Ok(Err(_)) => Err(LinkError::WorkerClosed),
            Err(_) => Err(LinkError::NotReading),
        }
    }

    /// Writes a control frame. These are small; a worker that cannot take one
    /// within keepalive_timeout is hung.
    pub(super) async fn write(&mut self, frame: Frame) -> Result<(), LinkError> {
        match timeout(self.env.bounds.keepalive_timeout, self.writer.send(frame)).await {
            Ok(Ok(())) => {
                self.unflushed = false;
                Ok(())
            }
            // The worker closed its end: it is exiting; let it (exit status kept).
            Ok(Err(_)) => Err(LinkError::WorkerClosed),
            Err(_) => Err(LinkError::NotReading),
        }
    }
}
