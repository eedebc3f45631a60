//! `train`: each scheme trains the built-in model on the generated data set on `ThreadComm`:
//! final test accuracy, wall time and bytes sent per rank.

use indicatif::ProgressBar;

use super::super::report::{bytes as fmt_bytes, secs, table};
use super::j;
use crate::bench::{BoxErr, Ctx, SuiteOutput};

const SUITE: &str = "train";
const SCHEMES: [&str; 7] = ["dense", "topk", "mgs", "omgs", "spardl", "exdyna", "hitopk"];

pub fn run(ctx: &Ctx, pb: &ProgressBar) -> Result<SuiteOutput, BoxErr> {
    let epochs = if ctx.quick { 2 } else { 8 };
    let ranks = ctx.ranks;
    pb.set_length(SCHEMES.len() as u64);
    let mut out = SuiteOutput::default();
    let mut rows = Vec::new();
    let mut dense_acc = None;
    for scheme in SCHEMES {
        pb.set_message(scheme.to_string());
        let r = pipeline::train_suite(scheme, ranks, epochs)?;
        let params = [
            ("ranks", j(ranks)),
            ("epochs", j(epochs)),
            ("density", j(0.01)),
            ("model", j("mlp")),
        ];
        out.record(SUITE, scheme, &params, "test_acc", r.test_acc, "%");
        out.record(SUITE, scheme, &params, "time_s", r.time_s, "s");
        out.record(
            SUITE,
            scheme,
            &params,
            "bytes_per_rank",
            r.bytes_per_rank,
            "B",
        );
        if scheme == "dense" {
            dense_acc = Some(r.test_acc);
        }
        rows.push(vec![
            scheme.to_string(),
            format!("{:.2}", r.test_acc),
            dense_acc
                .map(|d| format!("{:+.2}", r.test_acc - d))
                .unwrap_or_default(),
            secs(r.time_s),
            fmt_bytes(r.bytes_per_rank),
        ]);
        pb.inc(1);
    }
    out.findings.push(format!(
        "train: {epochs} epochs at P = {ranks}, density 0.01; test accuracy per scheme in the `train` section"
    ));
    out.markdown = format!(
        "Each scheme trains the built-in MLP data-parallel on the generated classification \
         data set for {epochs} epochs on {ranks} rank threads (density 0.01 with error \
         feedback for the sparse schemes; momentum SGD with LR warm-up). Accuracy in %, the \
         difference to dense SGD, wall time and payload bytes sent per rank.\n\n{}",
        table(
            &["scheme", "test acc %", "vs dense", "time", "bytes/rank"],
            &rows
        )
    );
    Ok(out)
}
