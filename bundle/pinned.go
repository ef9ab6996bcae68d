package bundle

// The bytes of the pinned interpreter build. bundle/interpreter/build.sh reproduces
// them exactly (`make interpreter-verify` checks); change them only together with the
// recipe.
const (
	wasmSize     = 11314479
	wasmSHA256   = "7dbe0692f00e831a6d2e882dd87e9a0e719768de12387fd621d964008778eb5b"
	stdlibSize   = 10633846
	stdlibSHA256 = "09387ef00791e0a726d9418ae7c12f943e31a5d6bfa5235e43243e82e559cdae"
	siteSize     = 41945013
	siteSHA256   = "1607f3dbf064d1258f3a801c99594a0f06370634ab955c9412e60228e0165f0a"
	// The digest of site.zip unpacked (Interpreter.SiteTree).
	siteTreeSHA256 = "5af6844922505b5cef9fb99e2b8b52ee2b5c86c1f3353ff0ea6a95c96b79874a"
)

// sitePackages are the Debian packages of the site layer, as
// bundle/interpreter/site-recipe.sh pins them (a test checks the two agree).
func sitePackages() []Source {
	return []Source{
		{"tzdata_2026c-0+deb13u1_all.deb", "813b9bbbe14ccda2b24617b8bade0ade4d745957e75921766c153d249886bd4c"},
		{"tzdata-legacy_2026c-0+deb13u1_all.deb", "2779c2f5e9582fb501c592ec44d1d4421e0add97d25631926673be817a221028"},
		{"python3-dateutil_2.9.0-4_all.deb", "c86f3b7e878e8035b0850cd4e0d0ee014a4b5ee4a8fb7386d8998e100452d06c"},
		{"python3-pytz_2025.2-3_all.deb", "a5aa854697849a1e59737373795114587e2325f1d3f9c9a87092254ca88e58fd"},
		{"python3-six_1.17.0-1_all.deb", "cd1caa92b2860d1de83311cb77f9fab1ee66034ef997cc436d41a1707458666d"},
		{"python3-openpyxl_3.1.5+dfsg-2_all.deb", "9ff31ab90dc94cc47671b21182310dd8873af6eee959887d33adc23f87e2a610"},
		{"python3-et-xmlfile_2.0.0-1_all.deb", "48c1e79b67785c57e6ecc4c1583da875e9fb765ccc796efadceba931802edd92"},
		{"python3-xlrd_2.0.1-2_all.deb", "6594f62723d500ac50c0d82bea02a1c38f3a66178ca121700b63c5744a270009"},
		{"python3-petl_1.7.15-2_all.deb", "de4443c04b9e2151bbb0cd7661f05ae878ae9407613ac1b874dad7dcc8c7f3e2"},
		{"python3-tabulate_0.9.0-1_all.deb", "0b491dffc27d551319b7c35aeb0cefe4356154911bf4dae2708b1991feac3f28"},
		{"python3-agate_1.9.1-1_all.deb", "0b744267215b894ec52603200d0ec44aa888d1248094e564f5e392f0df8ef7ae"},
		{"python3-babel_2.17.0-1_all.deb", "348523917260fe1d9a15d19c9ca6ac0751ec2d5385f9c1a26c9bc27a966ba9e1"},
		{"python-babel-localedata_2.17.0-1_all.deb", "10fd7335fc0f568d046da0af7a6faaf3b57ede60bc77e9ded26ed4550e7d30c1"},
		{"python3-isodate_0.7.0-1_all.deb", "d5057f458babdf68125528cb6db1d1ae2a89703da18e0ca664dd084e5bfcb2bc"},
		{"python3-leather_0.4.0-1_all.deb", "48b4bfcf35a84965685fff8d0982827a4ce8555dcbdb5f37dfc71da5df0ce268"},
		{"python3-parsedatetime_2.6-3_all.deb", "5088e530036ea3db97788b243b6e6b181ddf67fd221d9968695215b453f090bd"},
		{"python3-pytimeparse_1.1.5-4_all.deb", "829cab41e56dc1811b8fdb4faad596c2a4bb0c6f79c147abaf430ca2dc0410d0"},
		{"python3-slugify_8.0.4-4_all.deb", "a758f45573cd717424876fcbf071bea0c535f3c2d8e78670f5a92367767a350d"},
		{"python3-text-unidecode_1.3-1_all.deb", "bc72c16d08076a62c577e4ace02c31dd655d9ddfa2a13ff4aa016b3546ac5101"},
	}
}

// nativeManifestSHA256 is the digest of the native root's manifest as
// bundle/native/build.sh makes it from bundle/native/recipe.sh (`make native-verify`
// checks a fresh build reproduces it); change it only together with the recipe.
const nativeManifestSHA256 = "d0805a3ea2974473c9604b2fda9c9c8c27c36aaa546d0a711a01afd07b9c8818"
