//! The shared accounting file layout (hook <-> hook, hook -> device plugin). To be written with the
//! runtime hook.
