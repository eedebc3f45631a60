//! `plan` suite (wired when its crate lands).

use indicatif::ProgressBar;

use crate::bench::{BoxErr, Ctx, SuiteOutput};

pub fn run(_ctx: &Ctx, _pb: &ProgressBar) -> Result<SuiteOutput, BoxErr> {
    Err("the plan suite is not wired yet".into())
}
