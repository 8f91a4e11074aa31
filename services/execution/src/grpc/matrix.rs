//! The permission matrix: stored versions, the one in force.

use muster_proto::execution::v1 as wire;
use muster_runtime::auth::Caller;

use super::{ExecutionGrpc, convert::matrix_to_wire};
use crate::{
    Error, Result,
    domain::{authority::Matrix, model::Finding},
};

/// Versions listed per page when the caller does not say.
const DEFAULT_PAGE: u32 = 100;
/// Most versions listed per page.
const MAX_PAGE: u32 = 1000;
/// Largest matrix document, in bytes.
const MAX_SOURCE_BYTES: usize = 1024 * 1024;

impl ExecutionGrpc {
    pub(super) async fn put_matrix(
        &self,
        caller: &Caller,
        request: wire::PutPermissionMatrixRequest,
    ) -> Result<wire::PutPermissionMatrixResponse> {
        if request.source.len() > MAX_SOURCE_BYTES {
            return Err(Error::invalid(
                "source",
                format!("the matrix has {} bytes; at most {MAX_SOURCE_BYTES} are accepted", request.source.len()),
            ));
        }
        let (matrix, warnings) =
            Matrix::parse(0, request.source, muster_runtime::time::now_millis(), caller.audit_name())
                .map_err(|diagnostics| Error::InvalidMatrix(diagnostics.iter().map(Finding::from).collect()))?;
        let stored = self.engine.store.put_matrix(matrix).await?;
        tracing::info!(version = stored.version, by = %stored.created_by, "permission matrix stored");
        let response = wire::PutPermissionMatrixResponse {
            matrix: Some(matrix_to_wire(&stored, true)),
            diagnostics: warnings
                .iter()
                .map(|warning| crate::grpc::convert::finding_to_wire(&Finding::from(warning)))
                .collect(),
        };
        self.engine.set_matrix(stored);
        Ok(response)
    }

    pub(super) async fn get_matrix(
        &self,
        request: wire::GetPermissionMatrixRequest,
    ) -> Result<wire::GetPermissionMatrixResponse> {
        let matrix = if request.version == 0 {
            (*self.engine.matrix()).clone()
        } else {
            self.engine.store.matrix(request.version).await?.ok_or_else(|| {
                Error::not_found(
                    "muster.execution.v1.PermissionMatrixVersion",
                    request.version.to_string(),
                    format!("the permission matrix has no version {}", request.version),
                )
            })?
        };
        Ok(wire::GetPermissionMatrixResponse { matrix: Some(matrix_to_wire(&matrix, true)) })
    }

    pub(super) async fn list_matrices(
        &self,
        request: wire::ListPermissionMatrixVersionsRequest,
    ) -> Result<wire::ListPermissionMatrixVersionsResponse> {
        let page_size = match request.page_size {
            0 => DEFAULT_PAGE,
            size => size.min(MAX_PAGE),
        };
        let before = if request.page_token.is_empty() {
            None
        } else {
            Some(
                request
                    .page_token
                    .parse::<u32>()
                    .map_err(|_| Error::invalid("page_token", "page_token is not one this service gave"))?,
            )
        };
        let mut versions = self.engine.store.matrices(before, page_size + 1).await?;
        let next_page_token = if versions.len() > page_size as usize {
            versions.truncate(page_size as usize);
            versions.last().map(|matrix| matrix.version.to_string()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(wire::ListPermissionMatrixVersionsResponse {
            versions: versions.iter().map(|matrix| matrix_to_wire(matrix, false)).collect(),
            next_page_token,
        })
    }
}
