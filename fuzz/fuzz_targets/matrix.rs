//! The permission matrix reader: any bytes give a report, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use muster_format::validate_permission_matrix;

fuzz_target!(|data: &[u8]| {
    let Ok(source) = std::str::from_utf8(data) else { return };
    let _ = validate_permission_matrix(source);
});
