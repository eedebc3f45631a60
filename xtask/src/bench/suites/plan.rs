//! `plan`: every merge planner on every zoo model under OMGS-SGD's 1 GbE preset at P = 16,
//! with the predicted iteration time (timeline of Eq. 2-9, 17) and the number of groups;
//! speed-ups of OMGS over TopK-SGD and MGS-SGD beside OMGS-SGD (Shi et al., INFOCOM 2020) Table VI.

use std::time::Instant;

use indicatif::ProgressBar;
use pipeline::timeline::{predict, OmgsCosts};
use pipeline::{zoo, Planner};

use super::super::report::{secs, table};
use super::j;
use crate::bench::{BoxErr, Ctx, Headline, SuiteOutput};

const SUITE: &str = "plan";
const P: usize = 16;

/// OMGS-SGD (Shi et al., INFOCOM 2020) Table V: groups after threshold merging (MGS) and after
/// OMGS.
const TABLE_V: [(&str, usize, usize); 4] = [
    ("vgg16", 13, 2),
    ("resnet50", 53, 2),
    ("inception_v4", 150, 7),
    ("lstm_ptb", 9, 6),
];

pub fn run(_ctx: &Ctx, pb: &ProgressBar) -> Result<SuiteOutput, BoxErr> {
    let costs = OmgsCosts::preset(P)?;
    let planners: Vec<(&str, Planner)> = vec![
        ("lags", Planner::Lags),
        ("topk", Planner::TopK),
        ("threshold", Planner::Threshold(8192)),
        ("omgs", Planner::Omgs),
        ("exact", Planner::Exact),
    ];
    pb.set_length((zoo::MODELS.len() * planners.len()) as u64);
    let mut out = SuiteOutput::default();
    let mut rows = Vec::new();
    let mut default_best_on = 0;
    for model in zoo::MODELS {
        let profile = zoo::profile(model)?;
        let mut iter = Vec::new();
        let mut row = vec![model.to_string(), profile.len().to_string()];
        for (name, planner) in &planners {
            pb.set_message(format!("{model} {name}"));
            let t0 = Instant::now();
            let plan = planner.plan(&profile, &costs)?;
            let planning_s = t0.elapsed().as_secs_f64();
            let tl = predict(&profile, &plan, &costs)?;
            let params = [
                ("model", j(model)),
                ("ranks", j(P)),
                ("preset", j("omgs_1gbe")),
                ("layers", j(profile.len())),
            ];
            out.record(SUITE, name, &params, "iter_time_s", tl.iteration_s, "s");
            out.record(SUITE, name, &params, "groups", plan.num_groups() as f64, "");
            out.record(SUITE, name, &params, "planning_time_s", planning_s, "s");
            row.push(format!(
                "{} ({} groups)",
                secs(tl.iteration_s),
                plan.num_groups()
            ));
            iter.push(tl.iteration_s);
            pb.inc(1);
        }
        let best = iter.iter().copied().fold(f64::MAX, f64::min);
        row.push(format!(
            "{:.2}× / {:.2}×",
            iter[1] / iter[4],
            iter[2] / iter[4]
        ));
        rows.push(row);
        if let Some((_, mgs, omgs)) = TABLE_V.iter().find(|t| t.0 == model) {
            let ours_mgs = Planner::Threshold(8192)
                .plan(&profile, &costs)?
                .num_groups();
            out.headlines.push(Headline {
                source: "OMGS-SGD (Shi et al., INFOCOM 2020) Table V".into(),
                claim: format!("{model}: threshold merging (8192) gives {mgs} groups"),
                ours: format!(
                    "{ours_mgs} groups (the paper's OMGS gives {omgs}; ours gives {}, from \
                     estimated rather than profiled backward times, so not comparable)",
                    Planner::Exact.plan(&profile, &costs)?.num_groups()
                ),
                reproduced: Some(ours_mgs == *mgs),
            });
        }
        if model == "resnet50" {
            out.headlines.push(Headline {
                source: "OMGS-SGD (Shi et al., INFOCOM 2020) Table VI".into(),
                claim: "ResNet-50 at P = 16: OMGS-SGD 1.3× faster than TopK-SGD, 2.4× than MGS-SGD (measured iterations)".into(),
                ours: format!(
                    "predicted with the authors' constants: {:.2}× over TopK-SGD, {:.2}× over MGS-SGD \
                     (direction reproduced; factors depend on backward times)",
                    iter[1] / iter[4],
                    iter[2] / iter[4]
                ),
                // The direction is comparable; the factors depend on the backward times.
                reproduced: Some(iter[1] / iter[4] > 1.0 && iter[2] / iter[4] > 1.0),
            });
        }
        let default_is_best = (iter[4] - best).abs() <= 1e-12 * best.max(1e-12);
        if default_is_best {
            default_best_on += 1;
        } else {
            out.findings.push(format!(
                "plan: on {model} the default planner is not the fastest predicted"
            ));
        }
    }
    out.findings.push(format!(
        "plan: under OMGS-SGD's 1 GbE preset at P = {P}, the default (exact) planner's predicted \
         iteration time is the lowest of every planner on {default_best_on} of {} zoo models",
        zoo::MODELS.len()
    ));
    let mut header = vec!["model", "layers"];
    header.extend(planners.iter().map(|p| p.0));
    header.push("exact vs topk / threshold");
    out.markdown = format!(
        "Predicted iteration time (OMGS-SGD's timeline, Eq. 2-9 and 17: backward, top-k \
         selection and all-gather of each merged group, overlapped as Algorithm 2 does) of \
         every merge planner, with the authors' fitted costs of their 16-node 1 GbE cluster \
         (the authors' code: top-k `2.189e-10·x·log2 x`, all-gather `(a + b·x·P·4)·2`). `lags` = \
         layer-wise (LAGS-SGD), `topk` = one group (TopK-SGD), `threshold` = MGS-SGD at 8192 \
         elements, `omgs` = OMGS-SGD (Shi et al., INFOCOM 2020) Algorithm 1, `exact` = the optimum of the same timeline \
         by dynamic programming (the default). The per-layer backward times are the zoo's \
         FLOP-based estimates, not the paper's GPU profiles, so iteration times differ from \
         Table VI while group counts of threshold merging are comparable with Table V.\n\n{}",
        table(&header, &rows)
    );
    Ok(out)
}
