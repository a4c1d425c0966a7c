//! `rewind group …`, and what `rewind bookmark` and `rewind revert` do when
//! given a group's name: one instant, or one revert, across its members.

use anyhow::Result;
use clap::Subcommand;
use rewind_http::api::{
    ChangeGroup, CreateBookmark, CreateClone, CreateGroup, GroupBookmarkInfo, GroupInfo, RevertVolume,
};

use crate::backend::Backend;
use crate::output;

#[derive(Subcommand)]
pub enum GroupCommand {
    /// A consistency group: volumes bookmarked and reverted together
    /// (`rewind group create shop db logs`). A volume is in one group at most.
    Create {
        name: String,
        volumes: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Add volumes to a group (later group bookmarks include them).
    Add {
        name: String,
        #[arg(required = true)]
        volumes: Vec<String>,
    },
    /// Remove volumes from a group (they keep their bookmarks).
    Remove {
        name: String,
        #[arg(required = true)]
        volumes: Vec<String>,
    },
    /// The groups, their members and bookmarks.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Delete a group (its members and their bookmarks stay).
    Delete { name: String },
}

pub fn group(backend: &dyn Backend, command: GroupCommand) -> Result<()> {
    match command {
        GroupCommand::Create { name, volumes, json } => {
            let group = backend.create_group(&CreateGroup { name, members: volumes })?;
            if json {
                return output::json(&group);
            }
            println!("created group {} of {}", group.name, members(&group));
            Ok(())
        }
        GroupCommand::Add { name, volumes } => {
            let group = backend.change_group(&name, &ChangeGroup { add: volumes, remove: Vec::new() })?;
            println!("group {name} is now {}", members(&group));
            Ok(())
        }
        GroupCommand::Remove { name, volumes } => {
            let group = backend.change_group(&name, &ChangeGroup { add: Vec::new(), remove: volumes })?;
            println!("group {name} is now {}", members(&group));
            Ok(())
        }
        GroupCommand::List { json } => {
            let groups = backend.groups()?;
            if json {
                return output::json(&groups);
            }
            if groups.is_empty() {
                println!("no groups; make one with `rewind group create NAME VOLUME…`");
            }
            for group in &groups {
                let bookmarks: Vec<&str> = group.bookmarks.iter().map(|bookmark| bookmark.name.as_str()).collect();
                println!("{}: {}; bookmarks: {}", group.name, members(group), list_or_none(&bookmarks));
                if group.revert_unfinished {
                    println!("  a group revert did not finish; restarting the server finishes it");
                }
            }
            Ok(())
        }
        GroupCommand::Delete { name } => {
            backend.delete_group(&name)?;
            println!("deleted group {name} (its volumes and their bookmarks stay)");
            Ok(())
        }
    }
}

fn members(group: &GroupInfo) -> String {
    let names: Vec<&str> = group.members.iter().map(String::as_str).collect();
    match names.len() {
        0 => "no volumes yet".to_owned(),
        _ => format!("volumes {}", names.join(", ")),
    }
}

fn list_or_none(items: &[&str]) -> String {
    if items.is_empty() {
        "none".to_owned()
    } else {
        items.join(", ")
    }
}

/// Whether `name` is a group's rather than a volume's. (A token limited to
/// some volumes cannot list groups, and cannot act on one.)
pub fn is_group(backend: &dyn Backend, name: &str) -> bool {
    backend.groups().is_ok_and(|groups| groups.iter().any(|group| group.name == name))
}

pub fn bookmark(backend: &dyn Backend, group: &str, request: &CreateBookmark, json: bool) -> Result<()> {
    let bookmark = backend.create_group_bookmark(group, request)?;
    if json {
        return output::json(&bookmark);
    }
    println!("bookmarked group {group} as {} at one instant:", bookmark.name);
    members_table(&bookmark);
    Ok(())
}

pub fn bookmarks(backend: &dyn Backend, group: &str, json: bool) -> Result<()> {
    let found = backend.groups()?.into_iter().find(|found| found.name == group);
    let group =
        found.ok_or_else(|| anyhow::anyhow!("no group named {group:?}; `rewind group list` shows the groups"))?;
    if json {
        return output::json(&group.bookmarks);
    }
    if group.bookmarks.is_empty() {
        println!("group {} has no bookmarks; add one with `rewind bookmark {} NAME`", group.name, group.name);
    }
    for bookmark in &group.bookmarks {
        println!("{}:", bookmark.name);
        members_table(bookmark);
    }
    Ok(())
}

fn members_table(bookmark: &GroupBookmarkInfo) {
    for member in &bookmark.members {
        println!("  {:<24} {}  (view: export {})", member.volume, member.bookmark.at, member.bookmark.export);
    }
}

pub fn revert(backend: &dyn Backend, group: &str, request: &RevertVolume, json: bool) -> Result<()> {
    let summary = backend.revert_group(group, request)?;
    if json {
        return output::json(&summary);
    }
    println!("reverted every member of group {group}:");
    for member in &summary.members {
        println!("  {:<24} to {}; the state before is bookmark {}", member.volume, member.revert.to, member.bookmark);
        for client in &member.disconnected {
            println!("    cut off {client}");
        }
    }
    println!("(`rewind revert {group} --undo` goes back)");
    Ok(())
}

pub fn clone(backend: &dyn Backend, group: &str, request: &CreateClone, json: bool) -> Result<()> {
    let clones = backend.clone_group(group, request)?;
    if json {
        return output::json(&clones);
    }
    let at = request.at.as_deref().unwrap_or_default();
    println!("created group {} of writable clones of group {group} as of its bookmark {at}:", clones.name);
    let address = backend.nbd_address().unwrap_or_else(|| "127.0.0.1:10809".into());
    for member in &clones.members {
        println!("  nbd://{address}/{member}");
    }
    Ok(())
}
