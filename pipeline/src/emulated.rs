//! Measured iterations of the OMGS-SGD (Shi et al., INFOCOM 2020) runtime on a model we
//! cannot train here (ResNet-50, Inception-v4, ... at P = 16): the real [`Reducer`] with its
//! compute and communication threads and the real ring all-gather, over `SimComm` in
//! real-time mode on the authors' fitted 1 GbE network
//! ([`cost_model::presets::OmgsPreset::ring_allgather_topology`]), with the GPU emulated:
//! forward, each layer's backward and each group's top-k selection take the profile's and
//! Eq. 10's time as sleeps.
//!
//! To fit P = 16 ranks of a 25-million-parameter model into one small machine, the tensors
//! handed to the reducer are `1/scale` of the model's, while every group still sends the
//! `⌈ρ·numel⌉` entries of the full-size group (indices inside the small tensor), so the
//! wire carries exactly what the real model's would. The measured iteration therefore
//! checks the runtime's overlap and the timeline's prediction, not the arithmetic.

use std::time::Duration;

use collectives::{ClockMode, Communicator, SimComm, ThreadComm, ThreadConfig};
use sparsify::SparseGrad;

use crate::plan::MergePlan;
use crate::profile::LayerProfile;
use crate::runtime::Reducer;
use crate::schemes::{selected_count, Compress, GroupPair, Payload, Scheme, SparseAllgather};
use crate::timeline::{OmgsCosts, StepCosts};
use crate::{Error, Result};

/// Top-k all-gather with an emulated GPU selection (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmulatedTopk {
    /// Selection time and density of the full-size groups.
    pub costs: OmgsCosts,
    /// Full-size elements per element handed to the reducer.
    pub scale: usize,
}

struct EmulatedCompress {
    /// The indices sent: the first `k` of the group, `k` those of the full-size group.
    idx: Vec<u32>,
    /// Emulated selection time, seconds.
    select_s: f64,
}

impl Compress for EmulatedCompress {
    fn compress(&mut self, grad: Vec<f32>) -> Result<Payload> {
        sleep_s(self.select_s);
        let k = self.idx.len();
        if grad.len() < k {
            return Err(Error::InvalidArgument(format!(
                "a group of {} elements cannot carry its {k} emulated entries",
                grad.len()
            )));
        }
        let val = grad[..k].to_vec();
        Ok(Payload::Sparse(SparseGrad::from_parts_unchecked(
            self.idx.clone(),
            val,
            grad.len(),
        )))
    }
}

impl Scheme for EmulatedTopk {
    fn name(&self) -> String {
        format!("emulated-topk-allgather(ρ={})", self.costs.density)
    }
    fn group(&self, _index: usize, numel: usize, _ranks: usize) -> Result<GroupPair> {
        let full = numel * self.scale;
        let k = selected_count(full, self.costs.density);
        if k > numel {
            return Err(Error::InvalidArgument(format!(
                "scale {} leaves a group of {numel} elements, fewer than the {k} entries its \
                 full-size group sends",
                self.scale
            )));
        }
        Ok((
            Box::new(EmulatedCompress {
                idx: (0..k as u32).collect(),
                select_s: self.costs.sparsify_s(full),
            }),
            Box::new(SparseAllgather {
                equal_counts: true,
                ..SparseAllgather::default()
            }),
        ))
    }
}

fn sleep_s(t: f64) {
    if t > 0.0 && t.is_finite() {
        std::thread::sleep(Duration::from_secs_f64(t));
    }
}

/// Settings of an emulated run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmulatedRun {
    /// Ranks P (the OMGS preset exists for 2, 4, 8, 16).
    pub ranks: usize,
    /// Full-size elements per emulated element.
    pub scale: usize,
    /// Measured iterations (after one warm-up).
    pub iterations: usize,
}

/// Mean measured iteration time of `plan` on `profile` (rank 0's, warm-up excluded), with
/// `costs` for the emulated selection and the network. See the module docs.
pub fn measure(
    profile: &LayerProfile,
    plan: &MergePlan,
    costs: OmgsCosts,
    run: EmulatedRun,
) -> Result<f64> {
    if run.scale == 0 || run.iterations == 0 {
        return Err(Error::InvalidArgument(
            "an emulated run needs scale and iterations ≥ 1".into(),
        ));
    }
    let topo = cost_model::presets::omgs_1gbe(run.ranks)?.ring_allgather_topology()?;
    let sizes: Vec<usize> = profile
        .layers()
        .iter()
        .map(|l| l.numel.div_ceil(run.scale).max(1))
        .collect();
    let backward: Vec<f64> = profile.layers().iter().map(|l| l.backward_s).collect();
    let scheme = EmulatedTopk {
        costs,
        scale: run.scale,
    };
    let per_rank = ThreadComm::run_with(run.ranks, ThreadConfig::default(), |comm| {
        let sim = SimComm::new(comm, topo, ClockMode::RealTime)?;
        let seed = sim.rank() as f32;
        let grads: Vec<Vec<f32>> = sizes
            .iter()
            .map(|&n| (0..n).map(|i| seed + i as f32 * 1e-3).collect())
            .collect();
        let mut reducer = Reducer::new(sim, &sizes, plan.clone(), &scheme)?;
        let mut times = Vec::new();
        for it in 0..run.iterations + 1 {
            reducer.begin()?;
            sleep_s(profile.forward_s());
            reducer.forward_done()?;
            for l in (0..sizes.len()).rev() {
                sleep_s(backward[l]);
                reducer.ready(l, &grads[l])?;
            }
            reducer.finish()?;
            if it > 0 {
                if let Some(t) = reducer.last_timeline() {
                    times.push(t.iteration_s);
                }
            }
        }
        drop(reducer.shutdown()?);
        Ok::<f64, Error>(times.iter().sum::<f64>() / times.len().max(1) as f64)
    });
    crate::error::rank0(per_rank)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::predict;

    /// A small model on 4 emulated ranks runs through the real reducer (an iteration lasts at
    /// least its emulated forward and backward), and a scale too coarse for the groups'
    /// entries is a typed error.
    #[test]
    fn emulated_iterations_follow_the_timeline() {
        let sizes = [40_000usize, 300, 90_000, 500, 60_000];
        let profile = LayerProfile::from_sizes("toy", &sizes)
            .unwrap()
            .with_backward_times(0.004, &[0.004, 0.001, 0.006, 0.001, 0.004])
            .unwrap();
        let costs = OmgsCosts::preset(4).unwrap();
        let plan = MergePlan::layerwise(sizes.len());
        let run = EmulatedRun {
            ranks: 4,
            scale: 4,
            iterations: 2,
        };
        let measured = measure(&profile, &plan, costs, run).unwrap();
        let compute = profile.forward_s() + profile.total_backward_s();
        assert!(measured >= compute, "{measured} vs {compute}");
        assert!(predict(&profile, &plan, &costs).unwrap().iteration_s >= compute);
        let coarse = EmulatedRun {
            scale: 100_000,
            ..run
        };
        assert!(matches!(
            measure(&profile, &plan, costs, coarse),
            Err(Error::InvalidArgument(_))
        ));
    }
}
