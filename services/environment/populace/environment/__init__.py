"""environment: hosts the root env of each run; reduces partials, decides rounds."""
