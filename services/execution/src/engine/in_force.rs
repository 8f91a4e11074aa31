//! What is in force for every execution: the permission matrix and the
//! agents' budgets, read from the store and kept in memory.

use std::{
    collections::HashMap,
    sync::{Arc, PoisonError},
};

use super::Engine;
use crate::{
    Result,
    domain::{
        authority::{DEFAULT_MATRIX, Matrix},
        budget::Budget,
    },
};

impl Engine {
    /// The permission matrix in force.
    pub(crate) fn matrix(&self) -> Arc<Matrix> {
        self.matrix.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Reads the matrix in force from the store, storing the default as
    /// version 1 on first start; a newer version stored elsewhere (another
    /// replica) is picked up the same way.
    pub(crate) async fn load_matrix(&self) -> Result<()> {
        let matrix = match self.store.latest_matrix().await? {
            Some(matrix) => matrix,
            None => self.store.first_matrix(default_matrix()).await?,
        };
        self.set_matrix(matrix);
        Ok(())
    }

    /// Reads the agents' budgets (set here or on another replica).
    pub(crate) async fn load_agent_budgets(&self) -> Result<()> {
        let budgets: HashMap<String, Budget> = self
            .store
            .agent_budgets()
            .await?
            .into_iter()
            .filter_map(|budget| Some((budget.agent_id()?.to_owned(), budget)))
            .collect();
        *self.agent_budgets.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(budgets);
        Ok(())
    }

    /// An agent's budget, if it has one with a limit per period.
    pub(crate) fn agent_budget(&self, agent_id: &str) -> Option<Budget> {
        let budgets = self.agent_budgets.read().unwrap_or_else(PoisonError::into_inner);
        budgets.get(agent_id).filter(|budget| budget.has_period_limit()).cloned()
    }

    /// Puts a matrix in force, unless a newer one already is.
    pub(crate) fn set_matrix(&self, matrix: Matrix) {
        let mut current = self.matrix.write().unwrap_or_else(PoisonError::into_inner);
        if matrix.version >= current.version {
            if matrix.version > current.version {
                tracing::info!(version = matrix.version, "permission matrix in force");
            }
            *current = Arc::new(matrix);
        }
    }
}

/// The built-in matrix, version 1.
pub(super) fn default_matrix() -> Matrix {
    Matrix::parse(1, DEFAULT_MATRIX.to_owned(), muster_runtime::time::now_millis(), "muster".to_owned())
        .map(|(matrix, _)| matrix)
        .expect("the built-in permission matrix is valid")
}
