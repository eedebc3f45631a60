//! `topk`: every selector with error feedback fused, against `stream` (the `r += g` memory
//! floor) and `naive` (`select_nth_unstable` on a copy of |x|).

use indicatif::ProgressBar;
use sparsify::{
    selector_by_name, ErrorFeedback, ExactTopK, HardThreshold, Selector, SELECTOR_NAMES,
};

use super::super::plot::{self, Series};
use super::super::report::{secs, table};
use super::super::timing::{median_time, median_time_with_setup};
use super::{gradient, j};
use crate::bench::{BoxErr, Ctx, SuiteOutput};

const SUITE: &str = "topk";

pub fn run(ctx: &Ctx, pb: &ProgressBar) -> Result<SuiteOutput, BoxErr> {
    let ds: Vec<usize> = if ctx.quick {
        vec![1 << 20, 1 << 22]
    } else {
        vec![1 << 20, 1 << 24, 1 << 26]
    };
    let densities = [0.001, 0.01];
    let reps = if ctx.quick { 3 } else { 5 };
    let cases: Vec<&str> = SELECTOR_NAMES
        .iter()
        .copied()
        .chain(["stream", "naive"])
        .collect();
    pb.set_length((ds.len() * densities.len() * cases.len()) as u64);
    let mut out = SuiteOutput::default();
    let mut rows = Vec::new();
    let mut by_case: Vec<Series> = cases
        .iter()
        .map(|c| Series {
            label: c.to_string(),
            points: vec![],
        })
        .collect();
    for &d in &ds {
        let grad = gradient(d, 7);
        for &density in &densities {
            let k = ((d as f64 * density) as usize).max(1);
            let mut times = Vec::new();
            for (ci, &case) in cases.iter().enumerate() {
                pb.set_message(format!("{case} d=2^{} ρ={density}", d.trailing_zeros()));
                let t = match case {
                    "stream" => {
                        let mut r = vec![0.0f32; d];
                        median_time(reps, || {
                            for (a, b) in r.iter_mut().zip(&grad) {
                                *a += *b;
                            }
                            std::hint::black_box(&r);
                            Ok(())
                        })?
                    }
                    "naive" => median_time(reps, || {
                        let mut a: Vec<f32> = grad.iter().map(|x| x.abs()).collect();
                        let (_, kth, _) = a.select_nth_unstable_by(d - k, |x, y| x.total_cmp(y));
                        std::hint::black_box(*kth);
                        Ok(())
                    })?,
                    name => {
                        let mut sel = steady_state_selector(name, &grad, k)?;
                        let ef = std::cell::RefCell::new(ErrorFeedback::new(d));
                        // Every repetition sees the same input: zero residual + grad.
                        median_time_with_setup(
                            reps,
                            || ef.borrow_mut().reset(),
                            || {
                                let (sg, _) = ef.borrow_mut().step(sel.as_mut(), &grad, k)?;
                                std::hint::black_box(sg.nnz());
                                Ok(())
                            },
                        )?
                    }
                };
                out.record(
                    SUITE,
                    case,
                    &[
                        ("d", j(d)),
                        ("density", j(density)),
                        ("k", j(k)),
                        ("error_feedback", j(!matches!(case, "stream" | "naive"))),
                    ],
                    "time_s",
                    t,
                    "s",
                );
                if density == 0.001 {
                    by_case[ci].points.push((d as f64, t));
                }
                times.push(t);
                pb.inc(1);
            }
            let stream = times[cases.iter().position(|c| *c == "stream").unwrap_or(0)];
            let mut row = vec![format!("2^{}", d.trailing_zeros()), density.to_string()];
            row.extend(
                times
                    .iter()
                    .map(|&t| format!("{} ({:.1}×)", secs(t), t / stream)),
            );
            rows.push(row);
            if d == *ds.last().unwrap_or(&d) && density == 0.001 {
                let at = |n: &str| times[cases.iter().position(|c| *c == n).unwrap_or(0)];
                out.findings.push(format!(
                    "top-k at d = 2^{}, ρ = 0.001, error feedback fused: exact {:.2}× the streaming pass \
                     (goal ≤ 2×), threshold {:.2}×, ExDyna {:.2}× (goal ≤ 1.5×), MSTopK {:.2}× (goal ≤ 3×); \
                     exact is {:.1}× faster than the naive select_nth (goal ≥ 2×)",
                    d.trailing_zeros(),
                    at("exact") / stream,
                    at("threshold") / stream,
                    at("exdyna") / stream,
                    at("mstopk") / stream,
                    at("naive") / at("exact"),
                ));
            }
        }
    }
    let plot_name = "topk_time.svg";
    plot::lines(
        &ctx.out.join(plot_name),
        "Top-k with fused error feedback, density 0.001",
        "d (elements)",
        "time (s)",
        true,
        true,
        &by_case,
    )
    .map_err(|e| -> BoxErr { e.to_string().into() })?;
    let mut header = vec!["d", "density"];
    header.extend(cases.iter().copied());
    out.markdown = format!(
        "Median time of one selection step with error feedback fused (`acc = r + g`, select, \
         zero the selected entries of `r`) per selector, on one core, next to `stream` (one \
         pass of `r[i] += g[i]` over the same buffers: the memory floor of the fused \
         operation) and `naive` (`select_nth_unstable` on a copy of |x|). In brackets: the \
         ratio to `stream`. The residual is reset (untimed) before each repetition, and the threshold selectors start from the threshold they \
         converge to in steady state (the exact k-th magnitude), since ExDyna's online scaling \
         (paper 002 Algorithm 5) needs many steps to get there from its initial value. Paper 000 §II-E models top-k cost as `γ·ρ·d·log d`; its GPU \
         figures are not comparable to a CPU.\n\n{}\n![top-k time]({plot_name})\n",
        table(&header, &rows)
    );
    Ok(out)
}

/// The selector `name`, with the threshold-based ones set to the threshold they settle on
/// after many steps (the k-th largest magnitude of this input).
fn steady_state_selector(name: &str, grad: &[f32], k: usize) -> Result<Box<dyn Selector>, BoxErr> {
    let kth = || -> Result<f32, BoxErr> { Ok(ExactTopK::new().select(grad, k)?.1.threshold) };
    Ok(match name {
        "threshold" => Box::new(HardThreshold::new(kth()?)?),
        "exdyna" => {
            let mut e = sparsify::ExDyna::new();
            e.set_threshold(kth()?);
            Box::new(e)
        }
        other => selector_by_name(other, 1)?,
    })
}
