//! The runtime of OMGS-SGD (Shi et al., INFOCOM 2020), Algorithm 2: a [`Reducer`] that a framework
//! calls from its backward hooks ("the gradient of layer `l` is ready"). It copies each gradient
//! into its merged group's buffer; when a group is complete it is compressed on the calling
//! (compute) thread and handed, in order, to a communication thread that owns the communicator, so
//! communication overlaps the rest of backward (Linear Pipelining (Wang et al.), Algorithm 1's
//! overlap of reduce and backward; Algorithm 3 when the plan is one group). `finish` waits for the
//! last group (Algorithm 2 line 7) and returns the averaged gradients for the optimizer.
//!
//! The reducer records its own [`Timeline`] with real timestamps in the form of the
//! prediction: backward spans by the per-hook timestamp method (the time between
//! consecutive "ready" calls), compression spans on the compute thread and communication
//! spans on the communication thread.
//!
//! Layers may be reported in any order within an iteration, each exactly once: framework
//! hooks do not promise the strict `L−1 … 0` order. A group is compressed as soon as its
//! last missing layer arrives, but groups are handed to the communication thread in one
//! fixed order (the last group first), so every rank issues the same collectives in the
//! same order whatever order its own hooks fired in.
//!
//! Errors are typed and never a silent wrong update: gradients of the wrong length, a
//! layer reported twice, `finish` before every layer arrived, ranks at
//! different iterations or groups ([`Error::RankOutOfStep`]), transport failures. After a
//! communication failure the reducer stays failed.

use std::thread::JoinHandle;
use std::time::Instant;

use collectives::Communicator;
use crossbeam_channel::{Receiver, Sender};

use crate::plan::MergePlan;
use crate::timeline::{GroupTiming, Span, Timeline, Traffic};
use crate::{Error, Result};

pub use crate::schemes::{Compress, Exchange, ExchangeCtx, Payload, Scheme};

/// The exchangers' checkpoint states, one per group.
type States = Vec<Vec<u8>>;

enum Job {
    Group { ctx: ExchangeCtx, payload: Payload },
    Save(Sender<Result<States>>),
    Restore(States, Sender<Result<()>>),
    Stop,
}

struct Done {
    group: usize,
    result: Result<Exchanged>,
}

/// One group's exchange as the communication thread hands it back: the averaged values,
/// the span it took, and its traffic where that depended on the data.
type Exchanged = (Vec<f32>, Span, Option<Traffic>);

/// What the communication thread ran with the last time.
struct CommThread<C> {
    handle: JoinHandle<C>,
    jobs: Sender<Job>,
    done: Receiver<Done>,
}

/// The per-rank reducer of one training job. See the module docs.
pub struct Reducer<C: Communicator + 'static> {
    sizes: Vec<usize>,
    plan: MergePlan,
    /// Offset of each layer inside its group's buffer.
    offsets: Vec<usize>,
    compressors: Vec<Box<dyn Compress>>,
    buffers: Vec<Vec<f32>>,
    thread: Option<CommThread<C>>,
    epoch: Instant,
    iteration: u64,
    /// Layers reported in the current iteration (in any order).
    reported: usize,
    /// Whether each layer has been reported in the current iteration.
    seen: Vec<bool>,
    /// Layers of each group not yet reported in the current iteration.
    missing: Vec<usize>,
    /// Groups handed to the communication thread in the current iteration (they go
    /// `G−1, G−2, …, 0`).
    launched: usize,
    in_iteration: bool,
    t0: f64,
    forward_end: Option<f64>,
    last_event: f64,
    backward: Vec<Span>,
    sparsify: Vec<Span>,
    failed: Option<Error>,
    last: Option<Timeline>,
    scheme_name: String,
}

impl<C: Communicator + 'static> Reducer<C> {
    /// A reducer for layers of `sizes` (forward order) merged by `plan`, reducing through
    /// `scheme`, communicating over `comm` (moved into the communication thread; get it
    /// back with [`Reducer::shutdown`]).
    pub fn new(comm: C, sizes: &[usize], plan: MergePlan, scheme: &dyn Scheme) -> Result<Self> {
        if sizes.is_empty() {
            return Err(Error::InvalidArgument(
                "a reducer needs at least one layer".into(),
            ));
        }
        if let Some(i) = sizes.iter().position(|&n| n == 0 || n > u32::MAX as usize) {
            return Err(Error::InvalidLayer {
                index: i,
                name: format!("layer{i}"),
                reason: format!("numel = {} outside 1..=u32::MAX", sizes[i]),
            });
        }
        plan.check_layers(sizes.len())?;
        let mut offsets = vec![0; sizes.len()];
        let mut compressors = Vec::new();
        let mut exchangers = Vec::new();
        let mut buffers = Vec::new();
        for g in 0..plan.num_groups() {
            let mut n = 0;
            for l in plan.range(g) {
                offsets[l] = n;
                n += sizes[l];
            }
            let (c, e) = scheme.group(g, n, comm.size())?;
            compressors.push(c);
            exchangers.push(e);
            buffers.push(vec![0.0; n]);
        }
        let epoch = Instant::now();
        let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded::<Job>();
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<Done>();
        let handle = std::thread::Builder::new()
            .name(format!("comm-{}", comm.rank()))
            .spawn(move || comm_loop(comm, exchangers, jobs_rx, done_tx, epoch))
            .map_err(|e| Error::CommThread(e.to_string()))?;
        let groups = plan.num_groups();
        let missing = (0..groups).map(|g| plan.range(g).len()).collect();
        Ok(Reducer {
            sizes: sizes.to_vec(),
            plan,
            offsets,
            compressors,
            buffers,
            thread: Some(CommThread {
                handle,
                jobs: jobs_tx,
                done: done_rx,
            }),
            epoch,
            iteration: 0,
            reported: 0,
            seen: vec![false; sizes.len()],
            missing,
            launched: 0,
            in_iteration: false,
            t0: 0.0,
            forward_end: None,
            last_event: 0.0,
            backward: vec![Span::default(); sizes.len()],
            sparsify: vec![Span::default(); groups],
            failed: None,
            last: None,
            scheme_name: scheme.name(),
        })
    }

    fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    fn check_failed(&self) -> Result<()> {
        match &self.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// The merge plan in use.
    pub fn plan(&self) -> &MergePlan {
        &self.plan
    }

    /// The scheme's name.
    pub fn scheme_name(&self) -> &str {
        &self.scheme_name
    }

    /// Iterations finished so far.
    pub fn iteration(&self) -> u64 {
        self.iteration
    }

    /// Starts an iteration (call before forward; optional: the first `ready` starts one).
    pub fn begin(&mut self) -> Result<()> {
        self.check_failed()?;
        if self.in_iteration && self.reported > 0 {
            return Err(Error::IncompleteIteration {
                iteration: self.iteration,
                missing: self.sizes.len() - self.reported,
            });
        }
        self.in_iteration = true;
        self.t0 = self.now();
        self.last_event = self.t0;
        self.forward_end = None;
        Ok(())
    }

    /// Marks the end of forward (optional), so the timeline separates `t_f` from backward.
    pub fn forward_done(&mut self) -> Result<()> {
        self.check_failed()?;
        if !self.in_iteration {
            self.begin()?;
        }
        let t = self.now();
        self.forward_end = Some(t);
        self.last_event = t;
        Ok(())
    }

    /// Changes the density of every group's compressor (density warm-up); dense schemes
    /// ignore it.
    pub fn set_density(&mut self, density: f64) -> Result<()> {
        if !(density.is_finite() && density > 0.0 && density <= 1.0) {
            return Err(Error::InvalidArgument(format!(
                "density {density} outside (0, 1]"
            )));
        }
        for c in &mut self.compressors {
            c.set_density(density);
        }
        Ok(())
    }

    /// The hook: the gradient of `layer` (forward index) is ready. Layers may arrive in any
    /// order, each once per iteration; a group is compressed and communicated when it is
    /// complete and every group after it has been launched.
    pub fn ready(&mut self, layer: usize, grad: &[f32]) -> Result<()> {
        self.check_failed()?;
        let l_count = self.sizes.len();
        if layer >= l_count {
            return Err(Error::NoSuchLayer {
                layer,
                layers: l_count,
            });
        }
        if grad.len() != self.sizes[layer] {
            return Err(Error::GradientLength {
                layer,
                got: grad.len(),
                expected: self.sizes[layer],
            });
        }
        if !self.in_iteration {
            self.begin()?;
        }
        if self.seen[layer] {
            return Err(Error::LayerTwice {
                layer,
                iteration: self.iteration,
            });
        }
        let t = self.now();
        self.backward[layer] = Span {
            start: self.last_event - self.t0,
            end: t - self.t0,
        };
        let g = self.plan.group_of(layer);
        let off = self.offsets[layer];
        self.buffers[g][off..off + grad.len()].copy_from_slice(grad);
        self.seen[layer] = true;
        self.missing[g] -= 1;
        self.reported += 1;
        self.last_event = self.now();
        let groups = self.plan.num_groups();
        while self.launched < groups && self.missing[groups - 1 - self.launched] == 0 {
            let next = groups - 1 - self.launched;
            self.launched += 1;
            self.launch(next)?;
        }
        Ok(())
    }

    fn launch(&mut self, g: usize) -> Result<()> {
        let s0 = self.now();
        let n = self.buffers[g].len();
        let buf = std::mem::take(&mut self.buffers[g]);
        let payload = match self.compressors[g].compress(buf) {
            Ok(p) => p,
            Err(e) => {
                // The group's data is gone and the other ranks will wait for it: the
                // reducer stays failed rather than risk a wrong update.
                self.buffers[g] = vec![0.0; n];
                self.failed = Some(e.clone());
                return Err(e);
            }
        };
        let s1 = self.now();
        self.sparsify[g] = Span {
            start: s0 - self.t0,
            end: s1 - self.t0,
        };
        self.last_event = s1;
        let ctx = ExchangeCtx {
            iteration: self.iteration,
            group: g as u32,
            numel: n,
        };
        let sent = self
            .thread
            .as_ref()
            .map(|t| t.jobs.send(Job::Group { ctx, payload }).is_ok())
            .unwrap_or(false);
        if !sent {
            let e = Error::CommThread("the communication thread is gone".into());
            self.failed = Some(e.clone());
            return Err(e);
        }
        Ok(())
    }

    /// Waits for every group's communication and returns the averaged gradients, one
    /// vector per layer in forward order. Records the iteration's [`Timeline`].
    pub fn finish(&mut self) -> Result<Vec<Vec<f32>>> {
        self.check_failed()?;
        let l_count = self.sizes.len();
        if self.reported != l_count {
            return Err(Error::IncompleteIteration {
                iteration: self.iteration,
                missing: l_count - self.reported,
            });
        }
        let groups = self.plan.num_groups();
        let mut results: Vec<Option<Exchanged>> = vec![None; groups];
        let mut first_err = None;
        for _ in 0..groups {
            let done = match self.thread.as_ref().map(|t| t.done.recv()) {
                Some(Ok(d)) => d,
                _ => {
                    first_err.get_or_insert(Error::CommThread(
                        "the communication thread is gone".into(),
                    ));
                    break;
                }
            };
            match done.result {
                Ok(r) => {
                    if let Some(slot) = results.get_mut(done.group) {
                        *slot = Some(r);
                    }
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                    break;
                }
            }
        }
        if let Some(e) = first_err {
            self.failed = Some(e.clone());
            return Err(e);
        }
        let t_end = self.now();
        let mut out = vec![Vec::new(); l_count];
        let mut timings = Vec::with_capacity(groups);
        for g in (0..groups).rev() {
            let Some((avg, comm, traffic)) = results[g].take() else {
                let e = Error::CommThread(format!("group {g} never came back"));
                self.failed = Some(e.clone());
                return Err(e);
            };
            let range = self.plan.range(g);
            for l in range.clone() {
                let off = self.offsets[l];
                out[l] = avg[off..off + self.sizes[l]].to_vec();
            }
            self.buffers[g] = if avg.len() == self.buffers_len(g) {
                avg
            } else {
                vec![0.0; self.buffers_len(g)]
            };
            timings.push(GroupTiming {
                layers: range.collect(),
                numel: self.buffers[g].len(),
                sparsify: self.sparsify[g],
                comm: Span {
                    start: comm.start - self.t0,
                    end: comm.end - self.t0,
                },
                traffic,
            });
        }
        let fwd_end = self.forward_end.map(|f| f - self.t0).unwrap_or(0.0);
        let compute_end = timings
            .iter()
            .map(|g| g.sparsify.end)
            .fold(0.0f64, f64::max);
        let iteration_s = t_end - self.t0;
        self.last = Some(Timeline {
            forward: Span {
                start: 0.0,
                end: fwd_end,
            },
            backward: self.backward.clone(),
            groups: timings,
            iteration_s,
            compute_end_s: compute_end,
            non_overlapped_comm_s: (iteration_s - compute_end).max(0.0),
        });
        self.iteration += 1;
        self.reported = 0;
        self.seen.fill(false);
        for (g, m) in self.missing.iter_mut().enumerate() {
            *m = self.plan.range(g).len();
        }
        self.launched = 0;
        self.in_iteration = false;
        Ok(out)
    }

    fn buffers_len(&self, g: usize) -> usize {
        self.plan.range(g).map(|l| self.sizes[l]).sum()
    }

    /// The measured timeline of the last finished iteration.
    pub fn last_timeline(&self) -> Option<&Timeline> {
        self.last.as_ref()
    }

    /// The groups' selections that started from the previous iteration's threshold, and
    /// how many of those missed and fell back ([`Compress::warm_starts`], summed); `None`
    /// when no group has such a selector.
    pub fn warm_starts(&self) -> Option<(u64, u64)> {
        self.compressors
            .iter()
            .fold(None, |acc, c| add_warm_starts(acc, c.warm_starts()))
    }

    /// Everything the reducer carries to the next iteration, for a checkpoint: the
    /// iteration count and every group's compressor and exchanger state (residuals, a
    /// sparse algorithm's thresholds and partitions). Only between iterations.
    pub fn save_state(&self) -> Result<Vec<u8>> {
        self.check_failed()?;
        if self.reported != 0 {
            return Err(Error::IncompleteIteration {
                iteration: self.iteration,
                missing: self.sizes.len() - self.reported,
            });
        }
        let exchanged = self.ask(Job::Save)??;
        let mut e = crate::checkpoint::Enc::default();
        e.u64(self.iteration).u64(self.compressors.len() as u64);
        for (c, x) in self.compressors.iter().zip(&exchanged) {
            e.bytes(&c.save_state()?).bytes(x);
        }
        Ok(e.0)
    }

    /// Continues from [`Self::save_state`]'s output, for the same plan; between
    /// iterations. Bytes that do not parse, or a state of another group count, are an
    /// error that changes nothing; a group's state that does not fit (another length)
    /// leaves the reducer failed, as a half-restored reducer must not run.
    pub fn restore_state(&mut self, state: &[u8]) -> Result<()> {
        self.check_failed()?;
        let mut d = crate::checkpoint::Dec(state);
        let iteration = d.u64()?;
        let groups = d.usize()?;
        if groups != self.compressors.len() || self.reported != 0 {
            return Err(Error::InvalidArgument(format!(
                "a reducer state of {groups} groups for a reducer of {} between iterations",
                self.compressors.len()
            )));
        }
        let mut parts = Vec::with_capacity(groups);
        for _ in 0..groups {
            parts.push((d.bytes()?, d.bytes()?.to_vec()));
        }
        d.finish()?;
        let mut exchanged = Vec::with_capacity(groups);
        let mut applied = Ok(());
        for (c, (mine, x)) in self.compressors.iter_mut().zip(parts) {
            applied = applied.and_then(|()| c.restore_state(mine));
            exchanged.push(x);
        }
        let applied = applied.and_then(|()| self.ask(|tx| Job::Restore(exchanged, tx))?);
        if let Err(e) = &applied {
            self.failed = Some(e.clone());
        }
        applied?;
        self.iteration = iteration;
        Ok(())
    }

    /// Sends the communication thread a job that answers on a channel, and waits for the
    /// answer.
    fn ask<T>(&self, job: impl FnOnce(Sender<T>) -> Job) -> Result<T> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let gone = || Error::CommThread("the communication thread is gone".into());
        let t = self.thread.as_ref().ok_or_else(gone)?;
        t.jobs.send(job(tx)).map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())
    }

    /// Stops the communication thread and returns the communicator.
    pub fn shutdown(mut self) -> Result<C> {
        let t = self
            .thread
            .take()
            .ok_or_else(|| Error::CommThread("already shut down".into()))?;
        let _ = t.jobs.send(Job::Stop);
        t.handle
            .join()
            .map_err(|_| Error::CommThread("the communication thread panicked".into()))
    }
}

impl<C: Communicator + 'static> Drop for Reducer<C> {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.jobs.send(Job::Stop);
            let _ = t.handle.join();
        }
    }
}

fn comm_loop<C: Communicator>(
    comm: C,
    mut exchangers: Vec<Box<dyn Exchange>>,
    jobs: Receiver<Job>,
    done: Sender<Done>,
    epoch: Instant,
) -> C {
    let mut broken: Option<Error> = None;
    while let Ok(job) = jobs.recv() {
        let (ctx, payload) = match job {
            Job::Group { ctx, payload } => (ctx, payload),
            Job::Save(answer) => {
                let states = match &broken {
                    Some(e) => Err(e.clone()),
                    None => exchangers.iter().map(|x| x.save_state()).collect(),
                };
                let _ = answer.send(states);
                continue;
            }
            Job::Restore(states, answer) => {
                let r = match &broken {
                    Some(e) => Err(e.clone()),
                    None => exchangers
                        .iter_mut()
                        .zip(&states)
                        .try_for_each(|(x, s)| x.restore_state(s)),
                };
                let _ = answer.send(r);
                continue;
            }
            Job::Stop => break,
        };
        let group = ctx.group as usize;
        let result = if let Some(e) = &broken {
            Err(e.clone())
        } else {
            let start = epoch.elapsed().as_secs_f64();
            let r = match exchangers.get_mut(group) {
                Some(x) => x.exchange(&comm, ctx, payload),
                None => Err(Error::CommThread(format!("no exchanger for group {group}"))),
            };
            let end = epoch.elapsed().as_secs_f64();
            match r {
                Ok(v) if v.len() == ctx.numel => {
                    let traffic = exchangers.get(group).and_then(|x| x.last_traffic());
                    Ok((v, Span { start, end }, traffic))
                }
                Ok(v) => Err(Error::CommThread(format!(
                    "group {group}: exchange returned {} elements, expected {}",
                    v.len(),
                    ctx.numel
                ))),
                Err(e) => Err(e),
            }
        };
        if let Err(e) = &result {
            broken = Some(e.clone());
        }
        if done.send(Done { group, result }).is_err() {
            break;
        }
    }
    drop(exchangers);
    comm
}

/// The sum of two (warm-started, missed) tallies, either of which may be absent.
pub(crate) fn add_warm_starts(a: Option<(u64, u64)>, b: Option<(u64, u64)>) -> Option<(u64, u64)> {
    match (a, b) {
        (Some(x), Some(y)) => Some((x.0 + y.0, x.1 + y.1)),
        (x, None) | (None, x) => x,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schemes::{DenseAllreduce, TopkAllgather};
    use collectives::ThreadComm;

    #[test]
    fn dense_reducer_averages_and_records_a_timeline() {
        let sizes = [3usize, 2, 4];
        let out = ThreadComm::run(3, |comm| -> Result<(Vec<Vec<f32>>, Timeline)> {
            let r = comm.rank() as f32;
            let plan = MergePlan::from_starts(3, vec![0, 2])?;
            let mut red = Reducer::new(comm, &sizes, plan, &DenseAllreduce)?;
            let mut last = Vec::new();
            for _ in 0..2 {
                red.begin()?;
                red.forward_done()?;
                for l in (0..3).rev() {
                    red.ready(l, &vec![r + l as f32; sizes[l]])?;
                }
                last = red.finish()?;
            }
            let t = red
                .last_timeline()
                .cloned()
                .ok_or(Error::InvalidArgument("no timeline".into()))?;
            red.shutdown()?;
            Ok((last, t))
        })
        .unwrap();
        for (grads, t) in &out {
            for l in 0..3 {
                assert_eq!(grads[l], vec![1.0 + l as f32; sizes[l]]);
            }
            assert_eq!(t.groups.len(), 2);
            assert_eq!(t.groups[0].layers, vec![2]);
            assert!(t.iteration_s >= t.compute_end_s);
        }
    }

    /// Every rank reports the layers in its own order (as framework hooks may); the result
    /// equals the one from the strict backward order, on every rank.
    #[test]
    fn layers_in_any_order_give_the_in_order_result() {
        let sizes = [3usize, 5, 2, 4, 1, 6];
        let plan = || MergePlan::from_starts(6, vec![0, 2, 3]).unwrap();
        let grad = |r: usize, l: usize| -> Vec<f32> {
            (0..sizes[l])
                .map(|i| ((r * 31 + l * 7 + i) % 11) as f32 - 5.0)
                .collect()
        };
        let run = |shuffled: bool, scheme: &dyn Scheme| {
            ThreadComm::run(3, |comm| -> Result<Vec<Vec<Vec<f32>>>> {
                let r = comm.rank();
                let mut red = Reducer::new(comm, &sizes, plan(), scheme)?;
                let mut out = Vec::new();
                for it in 0..3 {
                    let mut order: Vec<usize> = (0..6).rev().collect();
                    if shuffled {
                        // A different order on every rank and iteration.
                        order.rotate_left((r + it) % 6);
                        if (r + it) % 2 == 1 {
                            order.reverse();
                        }
                    }
                    for l in order {
                        red.ready(l, &grad(r + it, l))?;
                    }
                    out.push(red.finish()?);
                }
                red.shutdown()?;
                Ok(out)
            })
            .unwrap()
        };
        let sparse = TopkAllgather { density: 0.4 };
        for scheme in [&DenseAllreduce as &dyn Scheme, &sparse] {
            let want = run(false, scheme);
            let got = run(true, scheme);
            assert_eq!(got, want, "{}", scheme.name());
            assert!(got[0].iter().flatten().flatten().any(|&v| v != 0.0));
        }
    }

    #[test]
    fn sparse_reducer_matches_a_p1_reference() {
        // With P = 1 and density 1, error feedback returns the gradient itself.
        let out = ThreadComm::run(1, |comm| -> Result<Vec<Vec<f32>>> {
            let mut red = Reducer::new(
                comm,
                &[2, 3],
                MergePlan::single(2),
                &TopkAllgather { density: 1.0 },
            )?;
            red.ready(1, &[1.0, -2.0, 3.0])?;
            red.ready(0, &[4.0, 5.0])?;
            red.finish()
        })
        .unwrap();
        assert_eq!(out[0], vec![vec![4.0, 5.0], vec![1.0, -2.0, 3.0]]);
    }

    #[test]
    fn misuse_is_a_typed_error() {
        ThreadComm::run(1, |comm| -> Result<()> {
            let mut red = Reducer::new(
                comm,
                &[2, 3, 1],
                MergePlan::layerwise(3),
                &TopkAllgather { density: 0.5 },
            )?;
            assert!(matches!(
                red.ready(2, &[1.0, 2.0]),
                Err(Error::GradientLength { .. })
            ));
            assert!(matches!(
                red.ready(7, &[1.0]),
                Err(Error::NoSuchLayer { .. })
            ));
            red.ready(2, &[1.0])?;
            assert!(matches!(
                red.ready(2, &[1.0]),
                Err(Error::LayerTwice { .. })
            ));
            assert!(matches!(
                red.finish(),
                Err(Error::IncompleteIteration { missing: 2, .. })
            ));
            assert!(matches!(
                red.begin(),
                Err(Error::IncompleteIteration { .. })
            ));
            red.ready(1, &[0.0; 3])?;
            assert!(red.set_density(0.0).is_err());
            assert!(matches!(
                red.ready(0, &[f32::NAN, 0.0]),
                Err(Error::Sparsify(sparsify::Error::NonFinite { .. }))
            ));
            // A failed compression leaves the reducer failed: no silent wrong update.
            assert!(red.finish().is_err());
            Ok(())
        })
        .unwrap();
        let bad = ThreadComm::run(1, |comm| -> Result<()> {
            Reducer::new(comm, &[2, 0], MergePlan::layerwise(2), &DenseAllreduce).map(|_| ())
        });
        assert!(bad.is_err());
        let bad = ThreadComm::run(1, |comm| -> Result<()> {
            Reducer::new(comm, &[2, 1], MergePlan::layerwise(3), &DenseAllreduce).map(|_| ())
        });
        assert!(bad.is_err());
    }

    #[test]
    fn a_rank_that_falls_behind_is_reported_on_every_rank() {
        let res = ThreadComm::run_all(
            2,
            collectives::ThreadConfig::with_timeout(std::time::Duration::from_secs(2)),
            |comm| -> Result<()> {
                let rank = comm.rank();
                let mut red = Reducer::new(comm, &[4], MergePlan::single(1), &DenseAllreduce)?;
                // Rank 1 skips an iteration's worth of work: its counter is ahead.
                let iterations = if rank == 1 { 1 } else { 2 };
                if rank == 1 {
                    red.iteration = 1;
                }
                for _ in 0..iterations {
                    red.ready(0, &[1.0; 4])?;
                    red.finish()?;
                }
                Ok(())
            },
        )
        .unwrap();
        for r in res {
            assert!(r.is_err(), "{r:?}");
        }
    }
}
