//! The parameter side of BSP-SGD, Linear Pipelining (Wang et al.), §3.3: the root alone
//! applies the update and sends the new weights to every rank by LP broadcast.
//!
//! - Algorithm 1 (`bsp1`): the broadcast runs stage by stage on its own thread and
//!   communicator while the next iteration's forward runs: forward of stage `s` waits only
//!   for stage `s`'s parameters ([`ParamBroadcast::wait`]), so the broadcast of stage
//!   `s + 1` overlaps it (lines 2-6: `nonblocking_broadcast(w^{i+1})`, `Forward(i)`,
//!   `sync_broadcast()`). The gradients' LP reduce to the root overlaps backward through
//!   the runtime's layer-wise groups (lines 7-11).
//! - Algorithm 2 (`bsp2`): one LP reduce after backward, the root's update, then the whole
//!   broadcast before anything else runs (fork and join).
//! - Algorithm 3 (`bsp3`): an LP all-reduce and the update on every rank, plus the root's
//!   weights broadcast every [`BSP3_SYNC_EVERY`] iterations (its lines 6-7; here the
//!   replicated updates are bit-identical already, so the broadcast changes nothing but
//!   costs what the paper's does).
//!
//! Stages are the broadcast's units because they are the forward's: a stage cannot start
//! before every one of its tensors has arrived.

use std::thread::JoinHandle;
use std::time::Instant;

use collectives::dense::{broadcast, BroadcastAlgo, DenseOptions};
use collectives::Communicator;
use crossbeam_channel::{Receiver, Sender};

use crate::timeline::Span;
use crate::{Error, Result};

/// Algorithm 1's predicted iteration: `predicted` (whose forward is the profile's, compute
/// alone) with the forward waiting stage by stage for the weights' LP broadcast on `link`
/// among `ranks` ([`crate::check::LpReduceCosts::overlapped_forward_s`], the forward split
/// over stages in proportion to their weights). Everything after the forward starts from its
/// end, so the rest shifts by the difference.
pub fn predict_with_broadcast(
    predicted: &crate::Timeline,
    stage_sizes: &[usize],
    link: cost_model::Link,
    ranks: usize,
) -> crate::Timeline {
    let lp = crate::check::LpReduceCosts {
        base: crate::check::RuntimeCosts {
            link,
            ranks,
            density: None,
            algorithm: None,
            sparsify_a: 0.0,
            sparsify_b: 0.0,
            host_a: 0.0,
            host_b: 0.0,
        },
    };
    let fwd = predicted.forward.len();
    let waited = lp.overlapped_forward_s(
        &crate::check::stage_forward_s(fwd, stage_sizes),
        stage_sizes,
    );
    let d = waited - fwd;
    let mut t = predicted.clone();
    let shift = |s: &mut Span| {
        s.start += d;
        s.end += d;
    };
    t.forward.end += d;
    t.backward.iter_mut().for_each(shift);
    for g in &mut t.groups {
        shift(&mut g.sparsify);
        shift(&mut g.comm);
    }
    t.iteration_s += d;
    t.compute_end_s += d;
    t
}

/// Algorithm 3's weight synchronisation period, iterations ("if iter % 5 = 0").
pub const BSP3_SYNC_EVERY: usize = 5;

/// One stage's broadcast result: its values and when its broadcast ran.
type StageDone = Result<(Vec<f32>, Span)>;

/// Broadcasts per-stage parameter buffers from rank 0, in stage order, on a thread of its
/// own. See the module docs.
pub struct ParamBroadcast {
    jobs: Option<Sender<Vec<Vec<f32>>>>,
    done: Receiver<StageDone>,
    handle: Option<JoinHandle<()>>,
    sizes: Vec<usize>,
    /// Stages of the broadcast in flight not yet waited for (the next is
    /// `sizes.len() − outstanding`).
    outstanding: usize,
    epoch: Instant,
    failed: Option<Error>,
}

impl ParamBroadcast {
    /// A broadcaster over `comm` (which it keeps) for stages of `sizes` elements, each
    /// sent by LP broadcast in blocks of `blocks[s]` bytes. `epoch` is the clock of the
    /// spans it reports.
    pub fn new(
        comm: Box<dyn Communicator>,
        sizes: Vec<usize>,
        blocks: Vec<usize>,
        epoch: Instant,
    ) -> Result<Self> {
        if blocks.len() != sizes.len() {
            return Err(Error::InvalidArgument(format!(
                "{} block sizes for {} stages",
                blocks.len(),
                sizes.len()
            )));
        }
        let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded::<Vec<Vec<f32>>>();
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<StageDone>();
        let handle = std::thread::Builder::new()
            .name(format!("bcast-{}", comm.rank()))
            .spawn(move || {
                let opts = DenseOptions::default().unchecked();
                let now = || epoch.elapsed().as_secs_f64();
                for stages in jobs_rx {
                    for (mut buf, &block_bytes) in stages.into_iter().zip(&blocks) {
                        let start = now();
                        let r = if buf.is_empty() {
                            Ok(())
                        } else {
                            broadcast(
                                &*comm,
                                &mut buf,
                                0,
                                BroadcastAlgo::LinearPipeline { block_bytes },
                                &opts,
                            )
                        };
                        let failed = r.is_err();
                        let out = r
                            .map(|()| (buf, Span { start, end: now() }))
                            .map_err(Error::from);
                        if done_tx.send(out).is_err() || failed {
                            return;
                        }
                    }
                }
            })
            .map_err(|e| Error::CommThread(e.to_string()))?;
        Ok(ParamBroadcast {
            jobs: Some(jobs_tx),
            done: done_rx,
            handle: Some(handle),
            sizes,
            outstanding: 0,
            epoch,
            failed: None,
        })
    }

    /// True while a broadcast has stages not yet waited for.
    pub fn in_flight(&self) -> bool {
        self.outstanding > 0
    }

    /// The stage [`Self::wait`] takes next, while a broadcast is in flight.
    pub fn next_stage(&self) -> Option<usize> {
        self.in_flight()
            .then(|| self.sizes.len() - self.outstanding)
    }

    /// Starts broadcasting `stages` (rank 0's values; other ranks' are overwritten, only
    /// their lengths matter). Every rank calls it in the same iteration.
    pub fn launch(&mut self, stages: Vec<Vec<f32>>) -> Result<()> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.in_flight() {
            return Err(Error::InvalidArgument(
                "a parameter broadcast is still in flight".into(),
            ));
        }
        if let Some(s) =
            (0..self.sizes.len()).find(|&s| stages.get(s).map(Vec::len) != Some(self.sizes[s]))
        {
            return Err(Error::GradientLength {
                layer: s,
                got: stages.get(s).map_or(0, Vec::len),
                expected: self.sizes[s],
            });
        }
        let jobs = self
            .jobs
            .as_ref()
            .ok_or_else(|| Error::CommThread("the broadcast thread has stopped".into()))?;
        jobs.send(stages)
            .map_err(|_| Error::CommThread("the broadcast thread has stopped".into()))?;
        self.outstanding = self.sizes.len();
        Ok(())
    }

    /// Waits for stage `stage` of the broadcast in flight (stages are waited for in
    /// order): its values, its broadcast span, and how long this call waited, seconds.
    pub fn wait(&mut self, stage: usize) -> Result<(Vec<f32>, Span, f64)> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let next = self.sizes.len() - self.outstanding;
        if !self.in_flight() || stage != next {
            return Err(Error::InvalidArgument(format!(
                "waited for stage {stage}, the broadcast's next is {next} ({} outstanding)",
                self.outstanding
            )));
        }
        let t = self.epoch.elapsed().as_secs_f64();
        let r = self
            .done
            .recv()
            .map_err(|_| Error::CommThread("the broadcast thread has stopped".into()))
            .and_then(|r| r);
        let waited = self.epoch.elapsed().as_secs_f64() - t;
        match r {
            Ok((v, span)) => {
                self.outstanding -= 1;
                Ok((v, span, waited))
            }
            Err(e) => {
                self.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    /// Stops the thread (after the broadcast in flight, if any, ends).
    pub fn shutdown(mut self) -> Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> Result<()> {
        self.jobs = None;
        match self.handle.take() {
            Some(h) => h
                .join()
                .map_err(|_| Error::CommThread("the broadcast thread panicked".into())),
            None => Ok(()),
        }
    }
}

impl Drop for ParamBroadcast {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use collectives::ThreadComm;

    #[test]
    fn algorithm_1_prediction_waits_for_the_broadcast_then_shifts_the_rest() {
        let link = cost_model::Link::new(1e-3, 1e-8);
        let profile = crate::LayerProfile::from_sizes("m", &[1000, 1_000_000])
            .unwrap()
            .with_backward_times(0.01, &[0.002, 0.003])
            .unwrap();
        let plan = crate::plan::MergePlan::layerwise(2);
        let costs = crate::timeline::SimpleCosts {
            gamma: 0.0,
            alpha: 1e-4,
            beta: 1e-9,
        };
        let base = crate::predict(&profile, &plan, &costs).unwrap();
        let stages = [1000, 1_000_000];
        let t = predict_with_broadcast(&base, &stages, link, 4);
        let d = t.forward.len() - base.forward.len();
        // The second stage's 4 MB take far longer than its forward: the forward waits.
        assert!(d > 0.01, "{d}");
        assert!((t.iteration_s - base.iteration_s - d).abs() < 1e-12);
        assert!((t.backward[1].start - base.backward[1].start - d).abs() < 1e-12);
        // One rank: nothing to broadcast, nothing changes.
        assert_eq!(predict_with_broadcast(&base, &stages, link, 1), base);
    }

    #[test]
    fn every_rank_receives_the_roots_stages_in_order() {
        let sizes = vec![3, 0, 40_000, 5];
        let out = ThreadComm::run(3, |comm| -> Result<Vec<Vec<f32>>> {
            let r = comm.rank();
            let mut b = ParamBroadcast::new(
                comm.split(0, r as u32)?,
                sizes.clone(),
                vec![64 << 10; 4],
                Instant::now(),
            )?;
            let mut got = Vec::new();
            for round in 0..2 {
                let mine: Vec<Vec<f32>> = sizes
                    .iter()
                    .map(|&n| (0..n).map(|i| (i + 10 * r + round) as f32).collect())
                    .collect();
                b.launch(mine)?;
                assert!(b.launch(vec![]).is_err());
                assert!(b.wait(1).is_err());
                for s in 0..sizes.len() {
                    got.push(b.wait(s)?.0);
                }
                assert!(!b.in_flight());
            }
            b.shutdown()?;
            Ok(got)
        })
        .unwrap();
        for o in &out {
            assert_eq!(o, &out[0]);
        }
        assert_eq!(out[0][2][7], 7.0);
        assert_eq!(out[0][4 + 2][7], 8.0);
        assert!(out[0][2].len() == 40_000 && out[0][1].is_empty());
    }
}
