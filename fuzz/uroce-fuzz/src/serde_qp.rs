//! serde for the provider's QP type and state, which carry none
//! themselves (uroce-provider does not depend on serde): remote
//! definitions with the same names and variants, so that a finding's JSON
//! reads and writes as the derives on the provider's enums made it
//! (`"qp_type": "Rc"`, `"qp_state": "Err"`). A field of either type in a
//! serialized struct says `#[serde(with = "crate::serde_qp::QpTypeDef")]`
//! (or `QpStateDef`).

use serde::{Deserialize, Serialize};
use uroce_provider::types::{QpState, QpType};

/// [`QpType`] as serde sees it.
#[derive(Serialize, Deserialize)]
#[serde(remote = "QpType", rename = "QpType")]
pub(crate) enum QpTypeDef {
    Rc,
    Uc,
    Ud,
}

/// [`QpState`] as serde sees it.
#[derive(Serialize, Deserialize)]
#[serde(remote = "QpState", rename = "QpState")]
pub(crate) enum QpStateDef {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Err,
}
