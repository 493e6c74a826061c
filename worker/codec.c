/* placeholder: filled in by its module's author */
