//! Who this process is and the names of users and groups: the effective user and group, the
//! supplementary groups, and the host's user and group databases (`getpwuid_r`,
//! `getpwnam_r`, `getgrnam_r`, `getgrgid_r`).

use std::ffi::{CStr, CString};

/// This process's effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// This process's effective group id.
pub fn egid() -> u32 {
    // SAFETY: getegid has no preconditions.
    unsafe { libc::getegid() }
}

/// This process's supplementary groups (at most 1024 of them).
pub fn groups() -> Vec<u32> {
    let mut groups = vec![0 as libc::gid_t; 1024];
    // SAFETY: `groups` has room for the count passed.
    let n = unsafe { libc::getgroups(groups.len() as i32, groups.as_mut_ptr()) };
    groups.truncate(n.max(0) as usize);
    groups
}

/// The id of group `name`, if the host has it.
pub fn group_id(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    let mut grp = zeroed_group();
    let mut buf = vec![0 as libc::c_char; 16384];
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: getgrnam_r with a NUL-terminated name, a group struct, a buffer of its
    // length and an out pointer, all live for the call.
    let r = unsafe { libc::getgrnam_r(c.as_ptr(), &mut grp, buf.as_mut_ptr(), buf.len(), &mut out) };
    (r == 0 && !out.is_null()).then_some(grp.gr_gid)
}

/// The name of group `gid`, if the host has it.
pub fn group_name(gid: u32) -> Option<String> {
    let mut grp = zeroed_group();
    let mut buf = vec![0 as libc::c_char; 16384];
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: as in `group_id`.
    let r = unsafe { libc::getgrgid_r(gid, &mut grp, buf.as_mut_ptr(), buf.len(), &mut out) };
    if r != 0 || out.is_null() {
        return None;
    }
    // SAFETY: getgrgid_r set gr_name to a NUL-terminated string inside `buf`.
    Some(unsafe { CStr::from_ptr(grp.gr_name) }.to_string_lossy().into_owned())
}

/// The name of user `uid`, if the host has it.
pub fn user_name(uid: u32) -> Option<String> {
    // SAFETY: `struct passwd` is plain data (pointers and integers); all-zero is valid.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16384];
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: getpwuid_r with a passwd struct, a buffer of its length and an out pointer.
    let r = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    if r != 0 || out.is_null() {
        return None;
    }
    // SAFETY: getpwuid_r set pw_name to a NUL-terminated string inside `buf`.
    Some(unsafe { CStr::from_ptr(pw.pw_name) }.to_string_lossy().into_owned())
}

/// The user id and primary group id of user `name`, if the host has it.
pub fn user_ids(name: &str) -> Option<(u32, u32)> {
    let c = CString::new(name).ok()?;
    // SAFETY: `struct passwd` is plain data (pointers and integers); all-zero is valid.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16384];
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: getpwnam_r with a NUL-terminated name, a passwd struct, a buffer of its
    // length and an out pointer, all live for the call.
    let r = unsafe { libc::getpwnam_r(c.as_ptr(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    (r == 0 && !out.is_null()).then_some((pw.pw_uid, pw.pw_gid))
}

/// The primary group id of user `uid`, if the host has it.
pub fn user_gid(uid: u32) -> Option<u32> {
    // SAFETY: as in `user_name`.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16384];
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: as in `user_name`.
    let r = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    (r == 0 && !out.is_null()).then_some(pw.pw_gid)
}

fn zeroed_group() -> libc::group {
    // SAFETY: `struct group` is plain data (pointers and integers); all-zero is valid.
    unsafe { std::mem::zeroed() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_its_group_have_names() {
        assert_eq!(user_name(0).as_deref(), Some("root"));
        assert_eq!(group_name(0).as_deref(), Some("root"));
        assert_eq!(group_id("root"), Some(0));
        assert_eq!(group_id("no-such-group-\u{1}"), None);
        assert_eq!(user_ids("root"), Some((0, 0)));
        assert_eq!(user_ids("no-such-user-\u{1}"), None);
        assert_eq!(user_gid(0), Some(0));
        assert!(groups().len() <= 1024);
        let _ = (euid(), egid());
    }
}
