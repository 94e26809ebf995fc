//! uroce verbs API.
pub use uroce_provider as provider;
pub use uroce_wire as wire;
