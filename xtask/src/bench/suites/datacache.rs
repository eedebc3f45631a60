//! `datacache`: the multi-level cache of paper 001 §4.1 over a throttled source (an emulated
//! networked file system): uncached, epoch 1 (cold), epoch 2 (warm), and with prefetch.

use datacache::bench_support::{self, BenchConfig};
use indicatif::ProgressBar;

use super::j;
use crate::bench::{BoxErr, Ctx, Headline, SuiteOutput};

const SUITE: &str = "datacache";

pub fn run(ctx: &Ctx, pb: &ProgressBar) -> Result<SuiteOutput, BoxErr> {
    pb.set_length(1);
    pb.set_message("throttled source, 50 MB/s, 2 ms per request");
    let cfg = if ctx.quick {
        BenchConfig {
            samples: 600,
            ..BenchConfig::default()
        }
    } else {
        BenchConfig::default()
    };
    let rep = bench_support::run(&cfg)?;
    pb.inc(1);
    let mut out = SuiteOutput::default();
    for ph in &rep.phases {
        let params = [
            ("samples", j(cfg.samples)),
            ("sample_bytes", j(cfg.sample_bytes)),
            ("bandwidth_bytes_per_s", j(cfg.bandwidth_bytes_per_s)),
            ("latency_s", j(cfg.latency_s)),
        ];
        out.record(
            SUITE,
            &ph.name,
            &params,
            "samples_per_s",
            ph.samples_per_s,
            "samples/s",
        );
    }
    out.headlines.push(Headline {
        source: "001 (DataCache) §4.1, Fig. 9".into(),
        claim: "the cache cuts I/O time by over 10× after the first epoch".into(),
        ours: format!(
            "epoch 2 reads {:.1}× faster than epoch 1 and {:.1}× faster than uncached",
            rep.epoch2_over_epoch1, rep.epoch2_over_uncached
        ),
        reproduced: Some(rep.epoch2_over_epoch1 >= 10.0 && rep.epoch2_over_uncached >= 10.0),
    });
    out.findings.push(format!(
        "datacache: epoch 2 {:.1}× epoch 1; prefetch overlaps {:.0}% of reading with compute ({:.2}× faster than no prefetch)",
        rep.epoch2_over_epoch1,
        100.0 * rep.prefetch_overlap,
        rep.prefetch_speedup
    ));
    out.markdown = format!(
        "{} samples of {} KiB from a source throttled to {:.0} MB/s and {:.0} ms per request \
         (an emulated networked file system), with a decode cost per sample. Phases: \
         `uncached` reads through no cache; `epoch1` fills the disk and memory levels; \
         `epoch2` reads them back; the prefetch phases overlap reading with a simulated compute \
         step.\n\n{}",
        cfg.samples,
        cfg.sample_bytes / 1024,
        cfg.bandwidth_bytes_per_s / 1e6,
        cfg.latency_s * 1e3,
        rep.table()
    );
    Ok(out)
}
