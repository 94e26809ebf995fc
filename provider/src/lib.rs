//! uroce provider: transport state machines, memory and the engine.
pub use uroce_wire as wire;
