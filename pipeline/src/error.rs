//! The crate's one error type: bad profiles and plans, misuse of the runtime, and failures
//! of the layers below (transport, sparsification, cost model).

/// Everything that can go wrong in planning, prediction, the runtime or training.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A profile with no layers: nothing to plan.
    #[error("profile `{0}` has no layers")]
    EmptyProfile(String),
    /// A layer whose size or time is outside its domain.
    #[error("layer {index} (`{name}`): {reason}")]
    InvalidLayer {
        /// Forward-order index of the layer.
        index: usize,
        /// Its name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A planner name that is not one of `lags, topk, threshold[:N], omgs, exact, mgwfbp,
    /// exhaustive`.
    #[error("unknown planner `{0}` (expected lags, topk, threshold[:N], omgs, exact, mgwfbp or exhaustive)")]
    UnknownPlanner(String),
    /// A model name the zoo does not have.
    #[error("unknown model `{0}` (expected vgg16, resnet50, inception_v4, lstm_ptb or bert_base)")]
    UnknownModel(String),
    /// A merge plan that is not a partition of the layers into contiguous groups.
    #[error("invalid plan: {0}")]
    InvalidPlan(String),
    /// A cost model that returned a negative or non-finite time.
    #[error(
        "cost model gave {what} = {value} s for {numel} elements; times must be finite and ≥ 0"
    )]
    InvalidCost {
        /// Which cost (sparsify or comm).
        what: &'static str,
        /// The group size asked about.
        numel: usize,
        /// The time returned.
        value: f64,
    },
    /// A problem too large for the planner asked for (the exhaustive search).
    #[error("{planner} planner handles at most {max} layers, the profile has {layers}")]
    TooManyLayers {
        /// The planner.
        planner: &'static str,
        /// Its limit.
        max: usize,
        /// The profile's layer count.
        layers: usize,
    },
    /// A gradient whose length differs from the layer's element count.
    #[error("gradient of layer {layer} has {got} elements, the profile says {expected}")]
    GradientLength {
        /// The layer.
        layer: usize,
        /// Length given.
        got: usize,
        /// Length expected.
        expected: usize,
    },
    /// A layer index outside the profile.
    #[error("layer {layer} is outside 0..{layers}")]
    NoSuchLayer {
        /// The layer given.
        layer: usize,
        /// Number of layers.
        layers: usize,
    },
    /// A layer reported a second time in one iteration.
    #[error("layer {layer} was reported twice in iteration {iteration}")]
    LayerTwice {
        /// The layer.
        layer: usize,
        /// The iteration.
        iteration: u64,
    },
    /// `finish` (or `begin`) called while layers of the iteration are still missing.
    #[error("iteration {iteration}: {missing} layer(s) not reported before finish")]
    IncompleteIteration {
        /// The iteration.
        iteration: u64,
        /// Layers not yet reported.
        missing: usize,
    },
    /// Ranks are at different iterations or groups: one fell behind or skipped ahead.
    #[error("rank {rank} is at iteration {mine} group {my_group}, rank {peer} sent iteration {theirs} group {their_group}")]
    RankOutOfStep {
        /// This rank.
        rank: usize,
        /// The peer whose message disagrees.
        peer: usize,
        /// This rank's iteration.
        mine: u64,
        /// The peer's iteration.
        theirs: u64,
        /// This rank's group.
        my_group: u32,
        /// The peer's group.
        their_group: u32,
    },
    /// The communication thread stopped (after an error or a panic).
    #[error("communication thread stopped: {0}")]
    CommThread(String),
    /// An argument outside its domain (the message says which and why).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A transport or collective failed.
    #[error(transparent)]
    Collectives(#[from] collectives::Error),
    /// Sparsification failed.
    #[error(transparent)]
    Sparsify(#[from] sparsify::Error),
    /// The cost model rejected its input.
    #[error("cost model: {0}")]
    CostModel(String),
    /// Reading or writing a file.
    #[error("io: {0}")]
    Io(String),
    /// Parsing or writing JSON.
    #[error("json: {0}")]
    Json(String),
    /// Drawing a chart.
    #[error("plot: {0}")]
    Plot(String),
    /// The candle model failed (shape error, non-finite gradient, ...).
    #[error("model: {0}")]
    Model(String),
    /// Reading the training data failed (missing or corrupt files, ...).
    #[error("data: {0}")]
    Data(String),
    /// The optimizer (LARS/LAMB with PTO) failed.
    #[error("optimizer: {0}")]
    Optimizer(String),
    /// A checkpoint could not be written or used (the same on every rank).
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// Ranks disagree on what must be the same everywhere (model, configuration, or the
    /// parameters after a step).
    #[error("rank {rank} disagrees with rank {peer} on {what}")]
    RankMismatch {
        /// This rank.
        rank: usize,
        /// The first rank that differs.
        peer: usize,
        /// What differs.
        what: String,
    },
}

/// Errors of other crates that this one keeps as their messages.
macro_rules! from_message {
    ($($src:ty => $variant:ident),* $(,)?) => {$(
        impl From<$src> for Error {
            fn from(e: $src) -> Self {
                Error::$variant(e.to_string())
            }
        }
    )*};
}
from_message!(
    candle_core::Error => Model,
    datacache::Error => Data,
    lars_pto::Error => Optimizer,
    cost_model::Error => CostModel,
    std::io::Error => Io,
    serde_json::Error => Json,
);

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Rank 0's result of a thread world (`ThreadComm::run*`), or the first rank's failure as
/// this crate's error.
pub(crate) fn rank0<T>(
    outs: std::result::Result<Vec<T>, collectives::RunError<Error>>,
) -> Result<T> {
    all_ranks(outs)?
        .into_iter()
        .next()
        .ok_or_else(|| Error::InvalidArgument("no ranks".into()))
}

/// Every rank's result of a thread world, or the first rank's failure as this crate's error.
pub(crate) fn all_ranks<T>(
    outs: std::result::Result<Vec<T>, collectives::RunError<Error>>,
) -> Result<Vec<T>> {
    outs.map_err(|e| match e {
        collectives::RunError::Failed { error, .. } => error,
        other => Error::CommThread(other.to_string()),
    })
}
