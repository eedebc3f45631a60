//! `train`: each scheme trains ResNet-20 (candle) on the real digits shipped in
//! `data/digits` through `datacache` on `ThreadComm`: final test accuracy, wall time, bytes
//! sent per rank, and the measured iteration time beside the timeline's prediction.

use indicatif::ProgressBar;
use pipeline::SchemeKind;

use super::super::report::{bytes as fmt_bytes, secs, table};
use super::j;
use crate::bench::{BoxErr, Ctx, SuiteOutput};

const SUITE: &str = "train";
const SCHEMES: [SchemeKind; 5] = [
    SchemeKind::Dense,
    SchemeKind::Topk,
    SchemeKind::Omgs,
    SchemeKind::Spardl,
    SchemeKind::Exdyna,
];

pub fn run(ctx: &Ctx, pb: &ProgressBar) -> Result<SuiteOutput, BoxErr> {
    let epochs = if ctx.quick { 1 } else { 6 };
    let ranks = ctx.ranks;
    pb.set_length(SCHEMES.len() as u64);
    let mut out = SuiteOutput::default();
    let mut rows = Vec::new();
    let mut dense_acc = None;
    for scheme in SCHEMES {
        let name = scheme.to_string();
        pb.set_message(name.clone());
        let r = pipeline::train_suite(scheme, ranks, epochs)?;
        let params = [
            ("ranks", j(ranks)),
            ("epochs", j(epochs)),
            ("density", j(0.01)),
            ("model", j("resnet20")),
            ("data", j("digits")),
        ];
        out.record(SUITE, &name, &params, "test_acc", r.test_acc, "%");
        out.record(SUITE, &name, &params, "time_s", r.time_s, "s");
        out.record(
            SUITE,
            &name,
            &params,
            "bytes_per_rank",
            r.bytes_per_rank,
            "B",
        );
        out.record(SUITE, &name, &params, "iteration_s", r.iteration_s, "s");
        out.record(
            SUITE,
            &name,
            &params,
            "predicted_iteration_s",
            r.predicted_s,
            "s",
        );
        if scheme == SchemeKind::Dense {
            dense_acc = Some(r.test_acc);
        }
        rows.push(vec![
            name,
            format!("{:.2}", r.test_acc),
            dense_acc
                .map(|d| format!("{:+.2}", r.test_acc - d))
                .unwrap_or_default(),
            secs(r.time_s),
            fmt_bytes(r.bytes_per_rank),
            secs(r.iteration_s),
            secs(r.predicted_s),
        ]);
        pb.inc(1);
    }
    out.findings.push(format!(
        "train: ResNet-20 on the real digits, {epochs} epochs at P = {ranks}, density 0.01; test accuracy per scheme in the `train` section"
    ));
    out.markdown = format!(
        "Each scheme trains ResNet-20 (candle, stage-wise backward overlapping the gradient \
         exchange) data-parallel on the 1,437 real 8×8 training digits for {epochs} epochs on \
         {ranks} rank threads (density 0.01 with error feedback for the sparse schemes; \
         momentum SGD with LR warm-up), evaluated on the 360 test digits. Accuracy in %, the \
         difference to dense SGD, wall time, payload bytes sent per rank, and the mean \
         measured iteration time beside the timeline's prediction for the plan (preset \
         1 GbE costs, so the prediction is for that cluster, not this machine).\n\n{}",
        table(
            &[
                "scheme",
                "test acc %",
                "vs dense",
                "time",
                "bytes/rank",
                "iteration",
                "predicted (1 GbE)"
            ],
            &rows
        )
    );
    Ok(out)
}
