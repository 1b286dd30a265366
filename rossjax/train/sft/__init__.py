"""SFT: the masked teacher-forcing step and the `rossjax train` trainer."""
