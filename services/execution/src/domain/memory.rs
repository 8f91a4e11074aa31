//! Memory: what runs remember across runs. The global memory is read by
//! every run; a role's memory by the runs of the agents that hold the role.
//! Workers add entries with a step's completion (`StepResult.remember`);
//! operators add and remove them. An assignment carries the newest entries
//! that fit in [`ASSIGNMENT_BYTES`].

/// Longest entry, in bytes.
pub const MAX_TEXT_BYTES: usize = 4096;
/// Most entries one step's result may add.
pub const MAX_NOTES_PER_RESULT: usize = 16;
/// Most text of the entries an assignment carries, in bytes.
pub const ASSIGNMENT_BYTES: usize = 64 * 1024;
/// Most entries read for an assignment, per memory.
pub const ASSIGNMENT_ENTRIES: u32 = 200;

/// An entry a worker asks to be remembered with its step's completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// True for the global memory, false for the executing agent's role's.
    pub global: bool,
    pub text: String,
}

/// Why a worker's notes cannot be remembered, if they cannot: too many, a
/// text empty or too long, a memory not named (`global` is `None`), or a
/// role's memory for an agent without a role.
pub fn check_notes(notes: &[(Option<bool>, String)], has_role: bool) -> Result<Vec<Note>, String> {
    if notes.len() > MAX_NOTES_PER_RESULT {
        return Err(format!("remember has {} entries; at most {MAX_NOTES_PER_RESULT} are taken", notes.len()));
    }
    notes
        .iter()
        .enumerate()
        .map(|(index, (global, text))| {
            check_text(text).map_err(|why| format!("remember[{index}].text {why}"))?;
            match global {
                None => Err(format!("remember[{index}].scope must be MEMORY_SCOPE_GLOBAL or MEMORY_SCOPE_ROLE")),
                Some(false) if !has_role => {
                    Err(format!("remember[{index}] is for the role's memory, but the agent has no role"))
                }
                Some(global) => Ok(Note { global: *global, text: text.clone() }),
            }
        })
        .collect()
}

/// One entry of a memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryEntry {
    pub id: String,
    /// The role whose memory it is; empty for the global memory.
    pub role: String,
    pub text: String,
    /// An agent, or `operator:<name>`.
    pub author: String,
    /// The execution whose step wrote it; empty for an operator's entry.
    pub execution_id: String,
    pub created_at: i64,
}

impl MemoryEntry {
    /// A new entry, written now.
    pub fn new(role: &str, text: &str, author: &str, execution_id: &str, now: i64) -> Self {
        Self {
            id: uuid::Uuid::now_v7().to_string(),
            role: role.to_owned(),
            text: text.to_owned(),
            author: author.to_owned(),
            execution_id: execution_id.to_owned(),
            created_at: now,
        }
    }
}

/// Why a text cannot be remembered, if it cannot.
pub fn check_text(text: &str) -> Result<(), String> {
    if text.trim().is_empty() {
        return Err("is empty".to_owned());
    }
    if text.len() > MAX_TEXT_BYTES {
        return Err(format!("has {} bytes; at most {MAX_TEXT_BYTES} are kept", text.len()));
    }
    Ok(())
}

/// The newest entries of `memories` (each newest first) whose text fits in
/// [`ASSIGNMENT_BYTES`] together, memory by memory.
pub fn within_assignment(memories: impl IntoIterator<Item = Vec<MemoryEntry>>) -> Vec<MemoryEntry> {
    let mut room = ASSIGNMENT_BYTES;
    let mut kept = Vec::new();
    for memory in memories {
        for entry in memory {
            if entry.text.len() > room {
                break;
            }
            room -= entry.text.len();
            kept.push(entry);
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(role: &str, bytes: usize) -> MemoryEntry {
        MemoryEntry::new(role, &"x".repeat(bytes), "agent", "", 0)
    }

    #[test]
    fn an_assignment_takes_the_newest_entries_that_fit() {
        let global = vec![entry("", 40 * 1024), entry("", 30 * 1024), entry("", 1)];
        let role = vec![entry("risk", 20 * 1024), entry("risk", 4 * 1024)];
        let kept = within_assignment([global, role]);
        let sizes: Vec<(String, usize)> = kept.iter().map(|entry| (entry.role.clone(), entry.text.len())).collect();
        // The second global entry does not fit, and older ones stay out
        // with it; the role's newest does, its next one too.
        assert_eq!(sizes, vec![(String::new(), 40 * 1024), ("risk".to_owned(), 20 * 1024), ("risk".to_owned(), 4096)]);
    }

    #[test]
    fn a_workers_notes_are_checked() {
        let role_note = (Some(false), "the risk register moved".to_owned());
        let global_note = (Some(true), "the client prefers Fridays".to_owned());
        let notes = check_notes(&[role_note.clone(), global_note], true).expect("valid notes");
        assert_eq!(notes.iter().map(|note| note.global).collect::<Vec<_>>(), vec![false, true]);
        assert_eq!(
            check_notes(std::slice::from_ref(&role_note), false).unwrap_err(),
            "remember[0] is for the role's memory, but the agent has no role"
        );
        assert!(check_notes(&[(None, "x".to_owned())], true).unwrap_err().starts_with("remember[0].scope must be"));
        assert_eq!(check_notes(&[(Some(true), " ".to_owned())], true).unwrap_err(), "remember[0].text is empty");
        let many = vec![role_note; MAX_NOTES_PER_RESULT + 1];
        assert_eq!(check_notes(&many, true).unwrap_err(), "remember has 17 entries; at most 16 are taken");
    }

    #[test]
    fn texts_are_checked() {
        assert!(check_text("the client prefers Friday reports").is_ok());
        assert_eq!(check_text("  ").unwrap_err(), "is empty");
        assert!(check_text(&"x".repeat(MAX_TEXT_BYTES + 1)).unwrap_err().contains("4096"));
    }
}
